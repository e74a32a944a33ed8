"""Reasoning ("thinking") models: which format a model thinks in (formats), and a reply's thinking
split from its answer as it streams, with its budget (thinking). How earlier thinking is sent back
to a template is the prompt's (llmchat.prompt.reasoning_history)."""
