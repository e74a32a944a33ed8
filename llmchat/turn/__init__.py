"""One turn's parts, each with one job (the session, llmchat.session, puts them together):

- `plan`: what a prepared turn is (prompt, budget, stops, thinking) and the model facts it is built from;
- `policy`: the defaults every mode reads (the reply cap, what an invalid structured reply does);
- `stats`: a decoded sequence's outcome as a `TurnResult`, with its stats and notices;
- `record`: the one JSON record every mode prints;
- `sink`: where a finished turn goes (history, KV cache on disk), under one failure policy;
- `observer`: what a display hears during a turn, and the thinking display in front of it.
"""
