"""pytest plugin for llama.cpp's own server tests (tools/server/tests): the
tinyllama2 preset they start their servers from serves SmolLM2-135M-Instruct
(DFLASH2_SMOLLM2) instead of a model downloaded from Hugging Face, and, when
DFLASH2_DRAFT names a DFlash2 drafter, drafts with it through dflash2.

Loaded with `-p dflash2_presets`; the tests folder must be on sys.path (utils).
"""

import os

import utils


def smollm2_preset():
    server = utils.ServerProcess()
    server.offline = True
    server.model_hf_repo = None
    server.model_hf_file = None
    server.model_file = os.environ["DFLASH2_SMOLLM2"]
    server.model_alias = "tinyllama-2"
    server.n_ctx = 512
    server.n_batch = 32
    server.n_slots = 2
    server.n_predict = 64
    server.seed = 42
    draft = os.environ.get("DFLASH2_DRAFT")
    if draft:
        server.model_draft = draft
        server.spec_type = "draft-dflash"
    return server


# the presets' models are files here: nothing to download before the session
utils.ServerPreset.tinyllama2 = staticmethod(smollm2_preset)
utils.ServerPreset.load_all = staticmethod(lambda: None)
