"""The defaults that several layers share, each named once.

The context window, the prompt batch and the tool chain limit are read by the command line (its
help and option defaults), by loading, by the engine and by the models list. Written out in each
of them, they drifted apart unseen; here a change reaches every one. This module imports nothing,
so the lowest layer (the engine) may read it.
"""

# The default context window: the model's trained context, at most this many tokens. A bigger
# window costs KV memory on every load while most chats stay far below it.
DEFAULT_MAX_CTX = 8192

# Prompt tokens per llama.cpp decode step: llama.cpp's own n_batch default. Servers batch by
# themselves and report this value.
DEFAULT_BATCH_SIZE = 512

# Checkpoints of a recurrent or hybrid model's recurrent state (llmchat.engine.checkpoints), and
# the most memory they take: llama-server's --ctx-checkpoints and --cache-ram defaults.
DEFAULT_CTX_CHECKPOINTS = 32
DEFAULT_CTX_CHECKPOINTS_MIB = 8192

# Rounds of tool calls in one turn before the turn stops with a notice (--chain-limit).
DEFAULT_CHAIN_LIMIT = 5
