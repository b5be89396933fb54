"""Pipeline RL: actors and a learner joined by Redis Streams.

    wire.py          a SAWItem as a stream entry (JSON head + raw arrays, schema version, no pickle)
    streams.py       the sample stream (consumer group, acknowledgements, backpressure) and the
                     weight-announcement stream
    source.py        PipelineBatchSource: the learner's BatchSource; acknowledges after checkpoint
    actor.py         Actor, WeightFollower (weights swapped in between generation batches),
                     AnnouncingPublisher and make_learner
    redis_server.py  a local redis-server (AOF, appendfsync always) for development and tests

The recipes wire these for tic-tac-toe (``ludic.tictactoe.pipeline``: ``ludic actor``,
``ludic learner``, ``ludic train tictactoe --pipeline N``).
"""
