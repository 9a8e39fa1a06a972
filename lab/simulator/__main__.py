from lab.simulator.server import main

main()
