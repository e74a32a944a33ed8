"""A model run's start-up: from the options, the config and the model file to a ready session.
`loading` resolves and loads the model and builds the session; `before_load` begins the load
ahead and knows the context it will open; `engine_settings` the settings the engine opens with;
`saved_prompts` the config's `[prompts.NAME]` applied with `-p NAME`."""
