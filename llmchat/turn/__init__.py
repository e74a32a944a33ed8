"""The turn and the conversation it runs on: one road for every mode and every engine.

- `session`: `ChatSession`, the owner of a chat's state, and the turn (prepare -> decode ->
  record); `session_changes`: what a chat's commands change in it; `model_switch`: the model's
  parts and `/model` mid-conversation;
- `conversation`: the messages and their token ids; `branches`: forks of a stored conversation;
  `attachments`: files, images and audio taken into a message;
- `plan`: what a prepared turn is (prompt, budget, stops, thinking) and the request the engine
  decodes; `tokens`: the prompt rendered and tokenized; `room`: whether a file fits; `parting`:
  where the next prompt will leave this one (a hybrid's checkpoints); `compaction`: a long chat's
  summary;
- `stream`: one decoded reply read as the observer hears it; `markers`: a template's wrappers taken
  off a reply; `reading`: a model's raw output read without a model (`template parse`);
  `structured`: `--schema` and friends, and the reply validated;
- `tool_loop`: a turn with tools, in rounds; `sampled`: a completion an MCP server asks for;
- `policy`: the defaults every mode reads; `stats` and `metrics`: a decoded sequence's outcome and
  its honest numbers; `record`: the one JSON record every mode prints; `sink`: where a finished
  turn goes (history, KV cache on disk); `observer`: what a display hears during a turn.
"""
