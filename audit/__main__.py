from audit.entry import main

main()
