// The draft part of a slot's saved state: in the prompt cache, and in the
// PATH.dflash2 file beside a /slots save.
#include "dflash2-server-impl.h"

#include <cstdio>

size_t dflash2_server_state_size(const dflash2_server_spec * spec, llama_context * ctx_dft, llama_seq_id seq_id) {
    return spec ? spec->state_size(ctx_dft, seq_id) : 0;
}

void dflash2_server_state_save(const dflash2_server_spec * spec, llama_context * ctx_dft, llama_seq_id seq_id,
        std::vector<uint8_t> & dst) {
    if (spec) {
        spec->state_save(ctx_dft, seq_id, dst);
    }
}

bool dflash2_server_state_load(llama_context * ctx_tgt, llama_seq_id seq_id, const std::vector<uint8_t> & data) {
    dflash2_server_spec * spec = dflash2_server_spec_for(ctx_tgt);
    return spec && spec->state_load(seq_id, data);
}

void dflash2_server_slot_file_save(const dflash2_server_spec * spec, llama_seq_id seq_id, const std::string & path) {
    if (spec) {
        spec->slot_file_save(seq_id, path + ".dflash2");
    }
}

void dflash2_server_slot_file_load(llama_context * ctx_tgt, llama_seq_id seq_id, const std::string & path) {
    if (dflash2_server_spec * spec = dflash2_server_spec_for(ctx_tgt)) {
        spec->slot_file_load(seq_id, path + ".dflash2");
    }
}

bool dflash2_server_write_file(const std::string & path, const std::vector<uint8_t> & data) {
    FILE * f = std::fopen(path.c_str(), "wb");
    if (!f) {
        return false;
    }
    const bool ok = std::fwrite(data.data(), 1, data.size(), f) == data.size();
    return std::fclose(f) == 0 && ok;
}

std::vector<uint8_t> dflash2_server_read_file(const std::string & path) {
    std::vector<uint8_t> data;
    if (FILE * f = std::fopen(path.c_str(), "rb")) {
        uint8_t buf[1 << 16];
        size_t n;
        while ((n = std::fread(buf, 1, sizeof(buf), f)) > 0) {
            data.insert(data.end(), buf, buf + n);
        }
        std::fclose(f);
    }
    return data;
}
