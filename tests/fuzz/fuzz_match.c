/* fuzz_match.c: libFuzzer driver that compares the route scripts' pattern functions (script_match.c) with LuaJIT's, call for call. */
#include "../unit/match_diff.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* The input: a byte choosing the function and its extra arguments, a byte giving the pattern's length,
 * the pattern, then the subject. Sizes and quantifiers are kept small: LuaJIT's matcher, the reference,
 * takes exponential time on nested quantifiers. */
int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const char *const fns[] = { "find", "match", "gmatch", "gsub" };
    static const char *const repls[] = { "x", "%0", "%1", "%2", "x%", "FN", "TBL" };
    static lua_State *L;
    size_t plen, slen, q = 0;
    unsigned sel;
    const char *fname;

    if (size < 2) {
        return 0;
    }
    if (L == NULL && (L = match_diff_state()) == NULL) {
        abort();
    }
    sel = data[0];
    plen = data[1] % 24;
    if (plen > size - 2) {
        plen = size - 2;
    }
    slen = size - 2 - plen > 48 ? 48 : size - 2 - plen;
    for (size_t i = 0; i < plen; i++) {
        q += data[2 + i] != '\0' && strchr("*+-?", data[2 + i]) != NULL;
    }
    if (q > 4) {
        return 0;
    }
    fname = fns[sel & 3];
    lua_pushvalue(L, 1);
    lua_pushstring(L, fname);
    lua_pushlstring(L, (const char *) data + 2 + plen, slen);
    lua_pushlstring(L, (const char *) data + 2, plen);
    if ((sel & 3) == 3) {
        lua_pushstring(L, repls[(sel >> 2) % 7]);
        if (sel & 0x80) {
            lua_pushinteger(L, (sel >> 5) & 3);
        } else {
            lua_pushnil(L);
        }
    } else {
        if (sel & 0x40) {
            lua_pushinteger(L, (int) ((sel >> 2) & 15) - 8);
        } else {
            lua_pushnil(L);
        }
        if (sel & 0x80) {
            lua_pushboolean(L, 1);
        } else {
            lua_pushnil(L);
        }
    }
    if (lua_pcall(L, 5, 1, 0) != 0 || !lua_isnil(L, -1)) {
        fprintf(stderr, "%s\n", lua_tostring(L, -1));
        abort();
    }
    lua_pop(L, 1);
    return 0;
}
