from autoopt.cli import main

main()
