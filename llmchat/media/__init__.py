"""The way media come in: what a file is (by its bytes, not its name) and which projector (mmproj)
lets the model take it. `kinds` recognises images and audio; `projector` finds the projector and
checks its header before libmtmd sees it. The engine (llmchat.engine.media.local) evaluates them.
"""
