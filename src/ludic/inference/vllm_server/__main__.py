"""``python -m ludic.inference.vllm_server``: guarded, since vLLM spawns its engine core process."""

from ludic.inference.vllm_server.app import main

if __name__ == "__main__":
    main()
