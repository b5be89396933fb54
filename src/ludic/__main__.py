from ludic.cli import main
from ludic.distributed import exit_worker

main()
exit_worker()  # under torchrun: skip interpreter finalisation (see exit_worker)
