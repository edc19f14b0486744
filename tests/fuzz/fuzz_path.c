/* fuzz_path.c: libFuzzer driver for the path normalizer that routing and req.path use (the bytes are a client's target path). */
#include "route.h"

#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    u_char *out = malloc(size + 1), *again = malloc(size + 1);
    int normal = ric_route_path_normal(data, size);
    size_t n, m;

    ric_assert(out != NULL && again != NULL);
    if (ric_route_normalize(data, size, out, &n) == RIC_OK) {
        ric_assert(n <= size);
        /* the quick check that spares the copy says "normal" only when
         * normalizing gives the path back as it is */
        ric_assert(!normal || (n == size && memcmp(out, data, n) == 0));
        /* the result is normal: normalizing it again changes nothing */
        ric_assert(ric_route_path_normal(out, n));
        ric_assert(ric_route_normalize(out, n, again, &m) == RIC_OK);
        ric_assert(m == n && memcmp(again, out, n) == 0);
        /* a path stays a path */
        ric_assert(size == 0 || data[0] != '/' || (n > 0 && out[0] == '/'));
    } else {
        ric_assert(!normal);
    }
    free(again);
    free(out);
    return 0;
}
