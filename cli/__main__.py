from kvstore.cli.main import main

main()
