/* fuzz_sni.c: libFuzzer driver for the reader of a ClientHello's server_name extension (the bytes are the client's, read before OpenSSL parses them). */
#include "tls_server.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const u_char *name = NULL;
    size_t n = ric_tls_sni_name(data, size, &name);

    /* a name it hands out lies inside what it was given, after its header */
    if (n > 0) {
        ric_assert(name >= data + 5 && name + n <= data + size);
    }
    return 0;
}
