// An image prompt for the host tools, through libmtmd (built only when the
// tools link it: HOST_WITH_MTMD).
#pragma once

#include "host.h"

#include <memory>
#include <string>

struct host_image_prompt_decoder : host_prompt_decoder {
    size_t n_images     = 0; // images decoded (one per generation of the first prompt)
    size_t n_image_rows = 0; // their rows (image tokens) on the target, all together
};

// loads params.path_mmproj and params.path_image; the first prompt becomes the
// image followed by `first_prompt` through the chat template. Throws on failure.
std::unique_ptr<host_image_prompt_decoder> make_image_prompt_decoder(const host_target & tgt,
        const std::string & first_prompt);
