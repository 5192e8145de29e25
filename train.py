"""The main job: `horovodrun -np 2 python train.py [options]` (see --help)."""
from hvd_easgd.app.cli import main

if __name__ == "__main__":
    main()
