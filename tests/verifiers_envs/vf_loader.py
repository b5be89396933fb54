"""The ``load_environment(**kwargs)`` convention: ``verifiers:vf_loader`` calls it with ``env_args``."""

import vf_qa


def load_environment(**kwargs):
    return vf_qa.QATaskset(vf_qa.QAConfig(**kwargs))
