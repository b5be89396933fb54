"""Generate SFT cold-start data (same flags as `ludic datagen tictactoe`).

    python examples/tic_tac_toe/generate_synth_data.py --episodes 5000 --output data/tictactoe_sft_train_data.jsonl
    python examples/tic_tac_toe/generate_synth_data.py --source model --model <dir> --keep win --no-transform

Rollouts use FullDialog; winning episodes are kept (--keep win,draw to keep draws too); earlier
assistant turns are rewritten to the [TRUNCATED] thinking convention unless --no-transform.
"""

import json

from ludic.config import parse_config
from ludic.tictactoe.datagen import DatagenConfig, datagen

if __name__ == "__main__":
    print(json.dumps(datagen(parse_config(DatagenConfig, prog="generate_synth_data.py")), indent=2))
