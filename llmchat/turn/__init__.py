"""One turn's parts, each with one job (the session, llmchat.session, puts them together; none of
them imports it):

- `plan`: what a prepared turn is (prompt, budget, stops, thinking), the scope a turn runs in, the
  request the engine decodes, and the model facts it is built from;
- `tokens`: the prompt a turn sends, rendered, shaped for tools and tokenized;
- `stream`: one decoded reply read as the observer hears it;
- `tool_loop`: a turn with tools, in rounds: a strategy inside the session's turn, over a protocol;
- `reading`: a model's raw output read as a turn reads it, without a model (`template parse`);
- `policy`: the defaults every mode reads (the reply cap, what an invalid structured reply does);
- `stats`: a decoded sequence's outcome as a `TurnResult`, with its stats and notices;
- `record`: the one JSON record every mode prints;
- `sink`: where a finished turn goes (history, KV cache on disk), under one failure policy;
- `observer`: what a display hears during a turn, and the thinking display in front of it.
"""
