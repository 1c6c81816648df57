from patronus_tasks.cli import main

main()
