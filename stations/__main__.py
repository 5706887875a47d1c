from stations.cli import main

main()
