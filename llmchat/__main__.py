from llmchat.cli import main

main()
