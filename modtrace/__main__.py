from modtrace.cli import main

main()
