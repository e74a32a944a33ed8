from llmchat.launch import main

main()
