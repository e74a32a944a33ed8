"""What crosses llmchat's edges: outside text on its way to a terminal (safe_text), outside input
read within its bound (bounded_input), and the person asked a question (person). Every layer may
use it; it uses only the base modules."""
