"""A multi-turn verifiers environment for the packaged model: the sums of ``vf_sums``, and an ``Env`` whose ``run``
answers a wrong reply with feedback ("Not quite: ... Try again.") through ``interaction.turn``, up to three replies.
Its reward: the taskset's rubric on the last reply (``correct`` 1, ``bare`` 0.25) plus ``solved`` (weight 1),
recorded by the env itself, so a solved episode earns 2 or 2.25; ``turns`` and ``first_try`` go to the step's info.
Nothing in it knows Ludic.

    PYTHONPATH=examples/verifiers ludic train env --env verifiers:vf_retry --budget-minutes 10
"""

import verifiers.v1 as vf
from vf_sums import SumData, SumTaskset, last_int


class RetryEnvConfig(vf.EnvConfig):
    """One seat: the player."""

    player: vf.AgentConfig = vf.AgentConfig()


class RetryEnv(vf.Env[RetryEnvConfig]):
    """Up to three replies; after a wrong one, feedback that says whether the sum is higher or lower."""

    async def run(self, task, agents):
        data: SumData = task.data
        async with agents.player.interaction(task) as interaction:
            segment = await interaction.turn()
            turns = 1
            while not segment.terminated and last_int(segment.last_reply) != data.answer and turns < 3:
                got = last_int(segment.last_reply)
                hint = ("no number in your reply" if got is None
                        else f"the sum is {'higher' if data.answer > got else 'lower'} than {got}")
                segment = await interaction.turn(f"Not quite: {hint}. Try again, with the number only.")
                turns += 1
        solved = float(last_int(interaction.trace.last_reply) == data.answer)
        interaction.trace.record_reward("solved", solved, 1.0)
        interaction.trace.info["turns"] = turns
        interaction.trace.info["first_try"] = float(solved and turns == 1)


__all__ = ["RetryEnv", "SumTaskset"]
