/* fuzz_script_json.c: libFuzzer driver for the scripts' JSON decoder (and the encoder on what it gives). */
#include "script_json.h"
#include "ric_core.h"

#include <lauxlib.h>
#include <lualib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* The first byte picks the settings; the rest is the text. cjson and
 * cjson.safe agree on it; what decodes encodes (unless it holds NaN or
 * Inf, which encode refuses by default), and once its numbers are
 * written with 14 digits, it encodes and decodes back to the same. */
static const char check[] =
    "local cjson, safe = require('cjson').new(), require('cjson.safe').new()\n"
    "local function same(a, b)\n"
    "  if type(a) ~= type(b) then return false end\n"
    "  if type(a) == 'number' then return a == b or (a ~= a and b ~= b) end\n"
    "  if type(a) ~= 'table' then return a == b end\n"
    "  for k, v in pairs(a) do if not same(v, b[k]) then return false end end\n"
    "  for k in pairs(b) do if a[k] == nil then return false end end\n"
    "  return true\n"
    "end\n"
    "return function(mode, text)\n"
    "  cjson.decode_invalid_numbers(mode % 2 == 0) safe.decode_invalid_numbers(mode % 2 == 0)\n"
    "  cjson.decode_max_depth(1 + mode % 7 * 150) safe.decode_max_depth(1 + mode % 7 * 150)\n"
    "  local ok, v = pcall(cjson.decode, text)\n"
    "  local sv, err = safe.decode(text)\n"
    "  assert(ok == (err == nil), 'cjson and cjson.safe disagree')\n"
    "  if not ok then assert(v == err, 'two messages') return end\n"
    "  assert(same(v, sv), 'two values')\n"
    "  local eok, out = pcall(cjson.encode, v)\n"
    "  if not eok then assert(out:find('must not be NaN or Inf', 1, true), out) return end\n"
    "  local v1 = cjson.decode(out)\n"
    "  assert(same(cjson.decode(cjson.encode(v1)), v1), 'the round trip changed it: ' .. out)\n"
    "end\n";

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static lua_State *L;

    if (size == 0) {
        return 0;
    }
    if (L == NULL) {
        L = luaL_newstate();
        luaL_openlibs(L);
        ric_script_json_open(L);
        if (luaL_loadstring(L, check) != 0 || lua_pcall(L, 0, 1, 0) != 0) {
            ric_assert(!"the check does not load");
        }
        lua_setfield(L, LUA_REGISTRYINDEX, "fuzz_check");
    }
    lua_getfield(L, LUA_REGISTRYINDEX, "fuzz_check");
    lua_pushinteger(L, data[0]);
    lua_pushlstring(L, (const char *) data + 1, size - 1);
    if (lua_pcall(L, 2, 0, 0) != 0) {
        fprintf(stderr, "%s\n", lua_tostring(L, -1));
        ric_assert(!"the JSON module broke a rule");
    }
    lua_gc(L, LUA_GCSTEP, 0);
    return 0;
}
