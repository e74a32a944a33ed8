"""GGUF model files, read without llama.cpp: the header reader, the model-level checks, a model's
memory footprint and the report `info` prints, and the header cache between runs.

This is the lowest layer above the base modules: it knows the file format and llama.cpp's sizing
rules, and nothing of engines, prompts or the chat."""
