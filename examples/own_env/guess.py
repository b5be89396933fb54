"""Your own environment, trained in one call: a 5-turn guess-the-number game for the packaged model.

    python examples/own_env/guess.py          (MODEL=<path> STEPS=<n> to change the model or the length)
"""
import os
import random
import re

import ludic
from ludic import SingleAgentEnv, StepOutcome


class GuessEnv(SingleAgentEnv):
    max_turns = 5  # the one place the turn limit lives

    def env_reset(self, seed=None):
        self.secret = random.Random(seed).randint(1, 16)
        prompt = "I picked a number from 1 to 16. Reply <guess>N</guess>; I answer higher or lower."
        return prompt, {"instance": self.secret}  # the instance key: the prompt is the same for every secret

    def env_step(self, action):
        found = re.search(r"<guess>\s*(\d+)\s*</guess>", action)
        if found is None:
            return StepOutcome("Reply as <guess>N</guess>.", info={"success": 0.0})
        guess = int(found.group(1))
        if guess == self.secret:
            return StepOutcome("Correct!", reward=1.0, terminated=True, info={"success": 1.0})
        return StepOutcome("Higher." if guess < self.secret else "Lower.", info={"success": 0.0})


def demo(observation):  # the format cold start: example replies in the format the env reads
    return f"<guess>{random.randint(1, 16)}</guess>"


if __name__ == "__main__":
    result = ludic.train(GuessEnv, format_demos=demo, model=os.environ.get("MODEL"),
                         train_steps=int(os.environ.get("STEPS", 20)), max_completion_tokens=16)
    base, trained = result.results["base"], result.results["trained"]
    print(f"success {base['success_rate']:.1%} -> {trained['success_rate']:.1%}; report: {result.run_dir}/report.html")
