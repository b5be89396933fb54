"""Publish a Ludic checkpoint on the Hugging Face Hub.

    python scripts/push_to_hub.py CHECKPOINT REPO_ID --base-model BASE [--private] [--no-merge]
        [--revision BRANCH] [--commit-message MSG] [--dtype auto] [--eval-json FILE] [--out-dir DIR] [--dry-run]

CHECKPOINT is a ``step_XXXXXX/`` checkpoint, a run directory or a Hugging Face
model / LoRA adapter folder. The folder is prepared by ``ludic.hub.prepare_hub_folder``
(merged weights or adapter, tokenizer, model card) and uploaded with
huggingface_hub (log in with ``huggingface-cli login`` or set ``HF_TOKEN``).
``--dry-run`` prepares and lists the folder without uploading.
"""

from ludic.hub import main

if __name__ == "__main__":
    main()
