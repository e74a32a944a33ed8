"""The engine's media: images and audio in a prompt, both halves behind one seam.

`marks` says where media sits in a prompt's text; `local` evaluates it into a local model's context
through libmtmd; `server` and `parts` send it to a server (llama-server's own media, or OpenAI-style
content parts). llmchat.media.use hands an attachment to the half that the engine in use takes.
"""
