/* test_script_match.c: the route scripts' pattern functions give LuaJIT's results, case by case and on random patterns. */
#include "../../core/script_match.c"
#include "unit.h"
#include "match_diff.h"

#include <stdint.h>
#include <stdlib.h>

/* Calls diff(fname, s, p, a3, a4) (the function at index 1); a3/a4 NULL: nil, "#n": the number n,
 * "!": true. 1 when both libraries agree, else prints how they differ. */
static int
agree(lua_State *L, const char *fname, const char *s, size_t slen, const char *p, size_t plen,
      const char *a3, const char *a4)
{
    const char *args[2] = { a3, a4 };
    int ok;

    lua_pushvalue(L, 1);
    lua_pushstring(L, fname);
    lua_pushlstring(L, s, slen);
    lua_pushlstring(L, p, plen);
    for (int i = 0; i < 2; i++) {
        if (args[i] == NULL) {
            lua_pushnil(L);
        } else if (args[i][0] == '#') {
            lua_pushnumber(L, atof(args[i] + 1));
        } else if (args[i][0] == '!') {
            lua_pushboolean(L, 1);
        } else {
            lua_pushstring(L, args[i]);
        }
    }
    if (lua_pcall(L, 5, 1, 0) != 0) {
        fprintf(stderr, "  diff failed: %s\n", lua_tostring(L, -1));
        lua_pop(L, 1);
        return 0;
    }
    ok = lua_isnil(L, -1);
    if (!ok) {
        fprintf(stderr, "  %s\n", lua_tostring(L, -1));
    }
    lua_pop(L, 1);
    return ok;
}

#define AGREE(f, s, p, a3, a4) UNIT_CHECK(agree(L, f, s, strlen(s), p, strlen(p), a3, a4))

static uint32_t seed = 12345;

static uint32_t
rnd(uint32_t n)
{
    seed = seed * 1103515245u + 12345u;
    return (seed >> 8) % n;
}

int
main(void)
{
    static const char *const fns[] = { "find", "match", "gmatch", "gsub" };
    static const char *const pat_bits[] = {
        "a", "b", "x", ".", "%a", "%d", "%s", "%w", "%p", "%A", "%z", "%%", "%", "(", ")", "()",
        "[ab]", "[^a]", "[a-c]", "[%d]", "[]", "[", "]", "^", "$", "*", "+", "-", "?", "%b()",
        "%f[%w]", "%f[%z]",
        "%f", "%1", "%2", "%0", "%b", "\0", ")", "%g", "%G", "%x", "%X", "%u", "%l", "%c", "%C", "%S", "%.", "%q"
    };
    static const char *const sub_bits[] = { "a", "b", "x", "(", ")", "1", " ", "\0", "]", "ab", "%", "\n",
                                            "G", "\x7f", "\xe9", "F", "." };
    static const char *const repls[] = { "x", "%0", "%1", "%2", "x%", "%%", "%a", "FN", "TBL", "#7", "" };
    static const char *const inits[] = { NULL, "#1", "#0", "#-1", "#-3", "#3", "#40", "#2.7", "#-100" };
    lua_State *L = match_diff_state();
    char s[64], p[64];
    size_t sl, pl, k;

    UNIT_CASE("the state");
    UNIT_CHECK(L != NULL);
    if (L == NULL) {
        return UNIT_DONE("script_match");
    }

    UNIT_CASE("find and match");
    AGREE("find", "hello world", "o w", NULL, NULL);
    AGREE("find", "hello world", "l+", NULL, NULL);
    AGREE("find", "hello world", "(l+)(o)", NULL, NULL);
    AGREE("find", "hello", "", "#10", NULL);
    AGREE("find", "hello", "", "#6", NULL);
    AGREE("find", "hello", "l", "#-2", NULL);
    AGREE("find", "a.b", ".", "#1", "!");
    AGREE("find", "abc", "^b", NULL, NULL);
    AGREE("find", "abc", "c$", NULL, NULL);
    AGREE("find", "a$c", "$c", NULL, NULL);
    AGREE("find", "THE (quick) fox", "%((%a+)%)", NULL, NULL);
    AGREE("find", "f(a(b)c)d", "%b()", NULL, NULL);
    AGREE("find", "THE (quick) fox", "%f[%a]%a+", NULL, NULL);
    AGREE("find", "abc", "%f[%z]", NULL, NULL);
    AGREE("match", "key = value", "^(%w+)%s*=%s*(%w+)$", NULL, NULL);
    AGREE("match", "2024-01-02", "(%d+)-(%d+)-(%d+)", NULL, NULL);
    AGREE("match", "abcabc", "(abc)%1", NULL, NULL);
    AGREE("match", "hello", "()ll()", NULL, NULL);
    AGREE("match", "  x  ", "^%s*(.-)%s*$", NULL, NULL);
    AGREE("match", "[x]", "[]]", NULL, NULL);
    AGREE("match", "a-b", "[a%-]+", NULL, NULL);
    AGREE("match", "x", "[a-]", NULL, NULL);
    AGREE("match", "abc", "(a", NULL, NULL);
    AGREE("match", "abc", "a)", NULL, NULL);
    AGREE("match", "abc", "%", NULL, NULL);
    AGREE("match", "abc", "[a", NULL, NULL);
    AGREE("match", "abc", "%b", NULL, NULL);
    AGREE("match", "abc", "%fa", NULL, NULL);
    AGREE("match", "abc", "(a)%2", NULL, NULL);
    AGREE("match", "abc", "%0", NULL, NULL);
    AGREE("match", "abc", "(()a)%2", NULL, NULL);
    AGREE("match", "aaaa", "((((((((((((((((((((((((((((((((((a))))))))))))))))))))))))))))))))))", NULL,
          NULL);
    AGREE("match", "", "a?a?a?a?a?a?a?a?a?a?a?a?a?a?a?a?a?a?a?a?a?a?a?a?a?a?a?a?a?a?a?a?a?a?a?a?a?a?a?"
          "a?a?a?a?a?a?a?a?a?a?a?a?a?a?a?a?a?a?a?a?a?a?a?a?a?a?a?a?a?a?a?a?a?a?a?a?a?a?a?a?a?a?a?a?a?"
          "a?a?a?a?a?a?a?a?a?a?a?a?a?a?a?a?a?a?a?a?a?a?a?a?a?a?a?a?a?a?a?a?a?a?a?a?a?a?a?a?a?a?a?a?a?"
          "a?a?a?a?a?a?a?a?a?a?a?a?a?a?a?a?a?a?a?a?a?a?a?a?a?a?a?a?a?a?a?a?a?a?a?a?a?a?a?a?a?a?a?a?a?"
          "a?a?a?a?a?a?a?a?a?a?a?a?a?a?a?a?a?a?a?a?a?a?a?a?a?a?a?a?a?a?a?a?a?a?a?a?a?a?a?a?a?", NULL, NULL);
    AGREE("match", "abc", "b", "#2.9", NULL);
    AGREE("match", "abc", "b", "x", NULL);
    AGREE("match", "abc", "b", "#3", NULL);
    UNIT_CHECK(agree(L, "match", "a\0b", 3, "%z", 2, NULL, NULL));
    UNIT_CHECK(agree(L, "find", "a\0b", 3, "\0b", 2, NULL, NULL));
    UNIT_CHECK(agree(L, "find", "a\0b", 3, "(\0b)", 4, NULL, NULL));

    UNIT_CASE("gmatch");
    AGREE("gmatch", "one two  three", "%a+", NULL, NULL);
    AGREE("gmatch", "k=v, a=b", "(%w+)=(%w+)", NULL, NULL);
    AGREE("gmatch", "abc", "", NULL, NULL);
    AGREE("gmatch", "abc", "x*", NULL, NULL);
    AGREE("gmatch", "^a^a", "^a", NULL, NULL);
    AGREE("gmatch", "abc", "()", NULL, NULL);
    AGREE("gmatch", "abc", "(", NULL, NULL);

    UNIT_CASE("gsub");
    AGREE("gsub", "hello world", "o", "0", NULL);
    AGREE("gsub", "hello world", "(o)", "[%1%0%%]", NULL);
    AGREE("gsub", "hello world", "%w+", "%2", NULL);
    AGREE("gsub", "hello world", "%w+", "x%", NULL);
    AGREE("gsub", "hello world", "%w+", "%q", NULL);
    AGREE("gsub", "hello world", "", "-", NULL);
    AGREE("gsub", "hello world", "^h", "H", NULL);
    AGREE("gsub", "hello world", "l", "L", "#2");
    AGREE("gsub", "hello world", "l", "L", "#-1");
    AGREE("gsub", "hello world", "l", "L", "x");
    AGREE("gsub", "a b a c", "%a", "FN", NULL);
    AGREE("gsub", "a b a c", "(%a)()", "FN", NULL);
    AGREE("gsub", "a b a c", "%a", "TBL", NULL);
    AGREE("gsub", "a b a c", "%a", "#7", NULL);
    AGREE("gsub", "abc", "b", "!", NULL);
    UNIT_CHECK(agree(L, "gsub", "a\0a\0a", 5, "a", 1, "x", NULL));

    UNIT_CASE("random patterns");
    for (int i = 0; i < 60000; i++) {
        const char *a3 = NULL, *a4 = NULL;
        int quantifiers = 0;
        size_t n;

        pl = 0;
        for (k = rnd(8); k > 0 && pl < 40; k--) {
            const char *b = pat_bits[rnd(sizeof(pat_bits) / sizeof(pat_bits[0]))];
            n = b[0] == '\0' ? 1 : strlen(b);
            quantifiers += strchr("*+-?", b[0]) != NULL;
            memcpy(p + pl, b, n);
            pl += n;
        }
        if (quantifiers > 4) {
            continue; /* LuaJIT's own matcher, the reference, would take long */
        }
        sl = 0;
        for (k = rnd(12); k > 0 && sl < 40; k--) {
            const char *b = sub_bits[rnd(sizeof(sub_bits) / sizeof(sub_bits[0]))];
            n = b[0] == '\0' ? 1 : strlen(b);
            memcpy(s + sl, b, n);
            sl += n;
        }
        const char *f = fns[rnd(4)];
        if (strcmp(f, "gsub") == 0) {
            a3 = repls[rnd(sizeof(repls) / sizeof(repls[0]))];
            a4 = rnd(4) == 0 ? inits[rnd(sizeof(inits) / sizeof(inits[0]))] : NULL;
        } else if (strcmp(f, "gmatch") != 0) {
            a3 = inits[rnd(sizeof(inits) / sizeof(inits[0]))];
            a4 = strcmp(f, "find") == 0 && rnd(4) == 0 ? "!" : NULL;
            if (a4 != NULL && a3 == NULL) {
                a3 = "#1";
            }
        }
        if (!agree(L, f, s, sl, p, pl, a3, a4)) {
            UNIT_CHECK(0);
        } else {
            unit_passed++;
        }
    }
    lua_close(L);
    return UNIT_DONE("script_match");
}
