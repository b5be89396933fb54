from ludic.cli import main

main()
