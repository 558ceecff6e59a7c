from specsweep.cli import main

main()
