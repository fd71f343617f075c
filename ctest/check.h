// Minimal assertions for the C tests: report the failing expression and the
// library's last error, then exit non-zero.
#pragma once

#include "dflash2.h"

#include <stdio.h>
#include <stdlib.h>

#define CHECK(cond)                                                                  \
    do {                                                                             \
        if (!(cond)) {                                                               \
            fprintf(stderr, "%s:%d: CHECK(%s) failed; last error: '%s'\n", __FILE__, \
                    __LINE__, #cond, llama_spec_dflash2_last_error());               \
            exit(1);                                                                 \
        }                                                                            \
    } while (0)
