"""pytest plugin for llama.cpp's own server tests (tools/server/tests), offline.

- The presets of text models (tinyllama2, tinyllama_infill, stories15m_moe) keep
  their settings but serve SmolLM2-135M-Instruct (DFLASH2_SMOLLM2) instead of a
  model downloaded from Hugging Face.
- When DFLASH2_DRAFT names a DFlash2 drafter, every server on SmolLM2 drafts with
  it through dflash2 (`-md DRAFT --spec-type draft-dflash`): the presets set it,
  and a draft model the test chose is replaced by it when the server starts (only
  test_speculative chooses one); a test that turns drafting off (model_draft =
  None, test_speculative's reference run) runs without a drafter.
- download_file: the draft model of test_speculative is SmolLM2 itself (upstream's
  draft-simple then drafts SmolLM2 with SmolLM2); any other download fails at once
  with the URL, so tests that need other models fail in both runs, never hang.
- A server that would load its model from Hugging Face (the embeddings, rerank
  and vision presets, tests that name a bigger model) is not started: the test
  fails at once with the model's name. The router preset (no model) is unchanged.

Loaded with `-p dflash2_presets`; the tests folder must be on sys.path (utils).
"""

import os

import utils

SMOLLM2 = os.environ["DFLASH2_SMOLLM2"]
DRAFT = os.environ.get("DFLASH2_DRAFT")

# basename of a URL the tests download -> the local file that stands for it
LOCAL_FILES = {"stories15M-q4_0.gguf": SMOLLM2}


def on_smollm2(preset):
    def make():
        server = preset()
        server.offline = True
        server.model_hf_repo = None
        server.model_hf_file = None
        server.model_file = SMOLLM2
        if DRAFT:
            server.model_draft = DRAFT
            server.spec_type = "draft-dflash"
        return server
    return staticmethod(make)


for name in ("tinyllama2", "tinyllama_infill", "stories15m_moe"):
    setattr(utils.ServerPreset, name, on_smollm2(getattr(utils.ServerPreset, name)))

# the presets' models are files here or absent: nothing to download before the session
utils.ServerPreset.load_all = staticmethod(lambda: None)

upstream_start = utils.ServerProcess.start


def start(self, *args, **kwargs):
    remote = self.model_hf_repo or self.model_url
    if remote:
        name = f"{remote} {self.model_hf_file}" if self.model_hf_file else remote
        raise RuntimeError(f"offline: this test's server loads {name} from Hugging Face")
    if DRAFT and self.model_file == SMOLLM2 and self.model_draft is not None:
        self.model_draft = DRAFT
        self.spec_type = "draft-dflash"
    return upstream_start(self, *args, **kwargs)


utils.ServerProcess.start = start


def download_file(url, output_file_path=None):
    local = LOCAL_FILES.get(url.split("/")[-1])
    if local is None:
        raise RuntimeError(f"offline: this test downloads {url}")
    return local


# the test modules import it with `from utils import *`, after this plugin
utils.download_file = download_file
