// The first prompt with an image before its text, decoded through libmtmd the
// way llama-server decodes an image prompt: text chunks as token batches, the
// image chunk through mtmd_helper_decode_image_chunk, whose callback hands each
// decoded batch of image rows (M-RoPE positions) to the drafter.
#include "vision.h"

#include "mtmd-helper.h"
#include "mtmd.h"

#include <stdexcept>

namespace {

struct image_cb_data {
    host_drafter  * drafter;
    llama_context * ctx;
};

// after each decode of image rows: the same rows, as a batch, to the drafter
int32_t image_rows_to_drafter(const mtmd_helper_embd_batch * b, void * user_data) {
    const auto * data = static_cast<const image_cb_data *>(user_data);
    if (!data->drafter) {
        return 0;
    }
    common_batch batch(data->ctx);
    for (int32_t i = 0; i < b->n_tokens; ++i) {
        llama_pos pos[GGML_MROPE_SECTIONS] = { 0, 0, 0, 0 };
        for (int32_t j = 0; j < b->n_pos && j < GGML_MROPE_SECTIONS; ++j) {
            pos[j] = b->pos[j * b->n_tokens + i];
        }
        batch.add_embd({ b->embd + (size_t) i * b->n_embd, 1, (size_t) b->n_embd }, pos, b->seq_id, false);
    }
    data->drafter->process(batch);
    return 0;
}

struct host_vision : host_image_prompt_decoder {
    mtmd_context * mctx   = nullptr;
    mtmd_bitmap  * bitmap = nullptr;
    std::string    text; // the first prompt through the chat template, the image marker first

    host_vision(const host_target & tgt, const std::string & first_prompt) {
        mtmd_helper_log_set(host_log_errors_only, nullptr);
        mtmd_context_params mparams = mtmd_context_params_default();
        mparams.use_gpu       = false;
        mparams.print_timings = false;
        mparams.n_threads     = tgt.params.n_threads;
        mctx = mtmd_init_from_file(tgt.params.path_mmproj.c_str(), tgt.model, mparams);
        if (!mctx) {
            throw std::runtime_error("cannot load the projector " + tgt.params.path_mmproj);
        }
        bitmap = mtmd_helper_bitmap_init_from_file(mctx, tgt.params.path_image.c_str(), false,
                mtmd_helper_init_opt_default()).bitmap;
        if (!bitmap) {
            mtmd_free(mctx);
            throw std::runtime_error("cannot read the image " + tgt.params.path_image);
        }
        text = tgt.chat_text(std::string(mtmd_default_marker()) + first_prompt);
    }

    ~host_vision() override {
        mtmd_bitmap_free(bitmap);
        mtmd_free(mctx);
    }

    bool decode(host_target & tgt, host_drafter * drafter, size_t i_prompt, llama_seq_id seq, llama_pos & n_past,
            llama_token & id_last) override {
        if (i_prompt != 0) {
            return false;
        }
        mtmd_input_chunks * chunks = mtmd_input_chunks_init();
        const bool add_special = llama_model_chat_template(tgt.model, nullptr) == nullptr;
        const mtmd_input_text input = { text.c_str(), text.size(), add_special, true };
        const mtmd_bitmap * bitmaps[1] = { bitmap };
        if (mtmd_tokenize(mctx, chunks, &input, bitmaps, 1) != 0) {
            mtmd_input_chunks_free(chunks);
            throw std::runtime_error("mtmd_tokenize failed on the image prompt");
        }
        n_past = 0;
        bool ends_with_text = false;
        common_batch batch(tgt.ctx);
        const size_t n_chunks = mtmd_input_chunks_size(chunks);
        for (size_t c = 0; c < n_chunks; ++c) {
            const mtmd_input_chunk * chunk = mtmd_input_chunks_get(chunks, c);
            ends_with_text = mtmd_input_chunk_get_type(chunk) == MTMD_INPUT_CHUNK_TYPE_TEXT;
            if (ends_with_text) {
                size_t n = 0;
                const llama_token * tokens = mtmd_input_chunk_get_tokens_text(chunk, &n);
                for (size_t i = 0; i < n; ++i) {
                    const bool last = c + 1 == n_chunks && i + 1 == n;
                    const int32_t idx = batch.add(tokens[i], n_past++, seq, last);
                    if (batch.size() == tgt.params.n_batch || i + 1 == n) {
                        tgt.decode(batch);
                        if (drafter) {
                            drafter->process(batch);
                        }
                        if (last) {
                            id_last = tgt.argmax(idx);
                        }
                        batch.clear();
                    }
                }
                continue;
            }
            if (mtmd_encode_chunk(mctx, chunk) != 0) {
                mtmd_input_chunks_free(chunks);
                throw std::runtime_error("mtmd_encode_chunk failed");
            }
            image_cb_data data = { drafter, tgt.ctx };
            llama_pos new_n_past = n_past;
            const int32_t rc = mtmd_helper_decode_image_chunk(mctx, tgt.ctx, chunk, mtmd_get_output_embd(mctx), n_past,
                    seq, tgt.params.n_batch, &new_n_past, image_rows_to_drafter, &data);
            if (rc != 0) {
                mtmd_input_chunks_free(chunks);
                throw std::runtime_error("decoding the image failed: " + std::to_string(rc));
            }
            n_image_rows += mtmd_input_chunk_get_n_tokens(chunk);
            n_images += 1;
            n_past = new_n_past;
        }
        mtmd_input_chunks_free(chunks);
        if (!ends_with_text) {
            throw std::runtime_error("the image prompt must end with text (its last row gives the first token)");
        }
        return true;
    }
};

} // namespace

std::unique_ptr<host_image_prompt_decoder> make_image_prompt_decoder(const host_target & tgt,
        const std::string & first_prompt) {
    return std::make_unique<host_vision>(tgt, first_prompt);
}
