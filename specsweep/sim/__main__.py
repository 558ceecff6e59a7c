from specsweep.sim.server import main

main()
