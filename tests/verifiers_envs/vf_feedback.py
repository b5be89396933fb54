"""A multi-turn verifiers environment: an ``Env`` whose ``run`` answers each reply with feedback through
``interaction.turn`` (verifiers' user channel, as its TextArena env does) for up to three replies, and records its
own reward. Loaded as ``verifiers:vf_feedback``."""

import verifiers.v1 as vf

WORDS = ["apple", "river", "stone", "cloud", "green", "light", "paper", "sound"]


class WordData(vf.TaskData):
    """The secret word the env checks replies against."""

    word: str


class WordTask(vf.Task[WordData, vf.State, vf.TaskConfig]):
    """A rubric of one reward: the share of replies that contained the word; a reply saying "give up" stops."""

    @vf.stop
    async def gave_up(self, trace: vf.Trace) -> bool:
        return "give up" in trace.last_reply

    @vf.reward(weight=1.0)
    async def mentioned(self, task: WordData, trace: vf.Trace) -> float:
        replies = trace.assistant_messages
        return sum(task.word in (m.content or "") for m in replies) / max(1, len(replies))


class WordTaskset(vf.Taskset[WordTask, vf.TasksetConfig]):
    """One task per word."""

    def load(self):
        for word in WORDS:
            yield WordTask(WordData(prompt=f"Say the word '{word}'.", system_prompt="Reply briefly.", word=word),
                           self.config.task)


class FeedbackEnvConfig(vf.EnvConfig):
    """One seat: the player."""

    player: vf.AgentConfig = vf.AgentConfig()


class FeedbackEnv(vf.Env[FeedbackEnvConfig]):
    """Feedback after each reply, three replies at most; ``turns`` records how many it took."""

    async def run(self, task, agents):
        async with agents.player.interaction(task) as interaction:
            segment = await interaction.turn()
            turns = 1
            while not segment.terminated and task.data.word not in segment.last_reply and turns < 3:
                segment = await interaction.turn(f"Not yet: your reply must contain '{task.data.word}'.")
                turns += 1
        interaction.trace.record_reward("solved", float(task.data.word in interaction.trace.last_reply), 0.5)
        interaction.trace.info["turns"] = turns


__all__ = ["FeedbackEnv", "WordTaskset"]
