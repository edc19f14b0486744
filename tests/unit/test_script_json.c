/* test_script_json.c: the scripts' JSON module against Debian's lua-cjson (the same texts, values
 * and errors), and its bounds: every byte in the state's allocator, given back after an error, the
 * clock checked as it runs. */
#include "../../core/script_json.c"
#include "unit.h"

#include <lualib.h>

/* An allocator with a bound, as script.c's: what the state holds, counted. */
typedef struct {
    size_t bytes, limit;
    int refused;
} bounded_t;

static void *
test_alloc(void *ud, void *ptr, size_t osize, size_t nsize)
{
    bounded_t *b = ud;
    void *p;

    if (nsize == 0) {
        free(ptr);
        b->bytes -= ptr != NULL ? osize : 0;
        return NULL;
    }
    if (ptr == NULL) {
        osize = 0;
    }
    if (nsize > osize && b->bytes + (nsize - osize) > b->limit) {
        b->refused = 1;
        return NULL;
    }
    p = realloc(ptr, nsize);
    if (p != NULL) {
        b->bytes = b->bytes - osize + nsize;
    }
    return p;
}

static int guard_calls;
static int guard_stop_after = -1;

/* script.c's side of script_deadline.c, counted: each look at the clock,
 * and a stop once guard_stop_after looks have passed */
static int
test_over(void)
{
    guard_calls++;
    return guard_stop_after >= 0 && guard_calls > guard_stop_after;
}

static void
test_stop(lua_State *L)
{
    luaL_error(L, "stopped: it ran longer than a hook may");
}

/* Runs chunk (a function of (real, ours, real_safe, ours_safe) returning
 * passed, failed) and adds its counts. */
static void
run_lua(lua_State *L, const char *name, const char *chunk)
{
    UNIT_CASE(name);
    if (luaL_loadbuffer(L, chunk, strlen(chunk), name) != 0) {
        fprintf(stderr, "  %s: %s\n", name, lua_tostring(L, -1));
        unit_failed++;
        lua_pop(L, 1);
        return;
    }
    lua_getfield(L, LUA_REGISTRYINDEX, "real");
    lua_getfield(L, LUA_REGISTRYINDEX, "ours");
    lua_getfield(L, LUA_REGISTRYINDEX, "real_safe");
    lua_getfield(L, LUA_REGISTRYINDEX, "ours_safe");
    if (lua_pcall(L, 4, 2, 0) != 0) {
        fprintf(stderr, "  %s: %s\n", name, lua_tostring(L, -1));
        unit_failed++;
        lua_pop(L, 1);
        return;
    }
    unit_passed += (int) lua_tointeger(L, -2);
    unit_failed += (int) lua_tointeger(L, -1);
    lua_pop(L, 2);
}

/* Shared helpers for the chunks: deep equality (NaN equals NaN) and
 * calls compared by what they return or raise. */
#define PRELUDE \
    "local real, ours, real_safe, ours_safe = ...\n" \
    "local passed, failed = 0, 0\n" \
    "local function same(a, b)\n" \
    "  if type(a) ~= type(b) then return false end\n" \
    "  if type(a) == 'number' then return a == b or (a ~= a and b ~= b) end\n" \
    "  if type(a) ~= 'table' then return a == b end\n" \
    "  for k, v in pairs(a) do if not same(v, b[k]) then return false end end\n" \
    "  for k in pairs(b) do if a[k] == nil then return false end end\n" \
    "  return true\n" \
    "end\n" \
    "local function show(...) local t = {} for i = 1, select('#', ...) do\n" \
    "  local v = select(i, ...) t[i] = type(v) == 'string' and ('%q'):format(v) or tostring(v) end\n" \
    "  return table.concat(t, ', ') end\n" \
    "local function check(what, a, b)\n" \
    "  local ra = { pcall(a) } local rb = { pcall(b) }\n" \
    "  local ok = #ra == #rb\n" \
    "  for i = 1, math.max(#ra, #rb) do ok = ok and same(ra[i], rb[i]) end\n" \
    "  if ok then passed = passed + 1 else failed = failed + 1\n" \
    "    io.stderr:write('  FAIL ', what, ': cjson gives ', show(unpack(ra)), '; ours ', show(unpack(rb)), '\\n') end\n" \
    "end\n"

static const char decode_cases[] = PRELUDE
    "local texts = { '', ' ', '1', '-1', '+1', '01', '-01', '0x10', '-0x10', '0X1p3', '1.', '.5',\n"
    "  '1e5', '1E+5', '1e', '-', '--1', 'inf', '-inf', 'Infinity', '-Infinity', 'nan', 'NaN', '-nan',\n"
    "  'nan(123)', 'infinity', 'infx', '1.5e400', '-1e400', '1e-400', '123456789012345678901234567890',\n"
    "  'true', 'false', 'null', 'tru', 'nul', 'truex', 'true1', 'nullx', '[]', '{}', '[1,]', '[,1]',\n"
    "  '[1 2]', '{\"a\":1,}', '{\"a\" 1}', '{1:2}', '{\"a\":}', '[1]x', '[1] ', '[1]\\0x', '\\0', 'a\\0',\n"
    "  '[\"a\\0b\"]', '\"a\\0b\"', '\"abc', '\"a\\\\qb\"', '\"\\\\u00e9\"', '\"\\\\u0000\"',\n"
    "  '\"\\\\ud83d\\\\ude00\"', '\"\\\\ud83d\"', '\"\\\\ude00\"', '\"\\\\ud83dx\"', '\"\\\\ud83d\\\\u0041\"',\n"
    "  '\"\\\\u12\"', '\"\\\\u12G4\"', '\"\\\\/\"', '\"\\t\"', '\"\\1\"', '\"\\127\"', '\"\\255\"',\n"
    "  '[1,2,[3,{\"x\":null}]]', '{\"a\":1,\"a\":2}', '  [ 1 , 2 ]  ', '\\v1', '\\f1', '{\"\":1}', '-0',\n"
    "  '0', '-0.0', '1e308', '2e308', '9007199254740993', '0.1', '1/2', '[true false]', \"'a'\", '[1]]',\n"
    "  '{]', '[}', '{\"a\":1 \"b\":2}', '{\"a\"', '{\"a\":', '[', '{', '\"\\\\', '\"\\\\u', 'x', 'nulll',\n"
    "  '1 2', '[-]', '[+1]', '[01]', '[0x1f]', '[1.5e]', '[1e+]', '[.]', '-.5', '- 1', '[Inf]', '[-nan]',\n"
    "  '[nanx]', '\\239\\187\\191[1]', '\"\\\\U0041\"', '[\"\\\\u0041\\\\u00410\"]', '\"\\\\b\\\\f\\\\n\\\\r\\\\t\\\\\"\\\\\\\\\"',\n"
    "  '\"\\\\ud83d\\\\ud83d\"', '\"\\\\ud83d\\\\', '\"\\\\uD83D\\\\uDE00\"', '{\"a\":[{\"b\":[[],{}]}]}', '[1,\\n2\\r]',\n"
    "  '\"\\\\u004', '\"\\\\u00', '\"x\\\\\"', '[\"a\",\"b\\\\n\",\"c\"]', '{\"k\\\\u0000\":\"v\"}', '\"\\\\ud800\\\\udc00\"',\n"
    "  ('['):rep(1000) .. (']'):rep(1000), ('['):rep(1001) .. (']'):rep(1001), ('{\"a\":'):rep(1001) } \n"
    "for _, text in ipairs(texts) do\n"
    "  check('decode ' .. ('%q'):format(text:sub(1, 40)), function() return real.decode(text) end,\n"
    "    function() return ours.decode(text) end)\n"
    "  check('safe decode ' .. ('%q'):format(text:sub(1, 40)), function() return real_safe.decode(text) end,\n"
    "    function() return ours_safe.decode(text) end)\n"
    "end\n"
    "local r, o = real.new(), ours.new()\n"
    "r.decode_invalid_numbers(false) o.decode_invalid_numbers(false)\n"
    "for _, text in ipairs{ '+1', '01', '0x1', 'inf', 'nan', '-inf', 'Infinity', '1.', '-0', '0', '-', '1e5',\n"
    "    '[NaN]', '-01', '0.5', '-x', '[0]', '0.0', '-0x1', '[-Infinity]' } do\n"
    "  check('strict decode ' .. text, function() return r.decode(text) end, function() return o.decode(text) end)\n"
    "end\n"
    "for depth = 1, 4 do\n"
    "  r.decode_max_depth(depth) o.decode_max_depth(depth)\n"
    "  for _, text in ipairs{ '[[[1]]]', '{\"a\":{\"b\":{}}}', '[{\"a\":[1]}]', '[]', '1', '[[],[[]]]' } do\n"
    "    check('depth ' .. depth .. ' ' .. text, function() return r.decode(text) end,\n"
    "      function() return o.decode(text) end)\n"
    "  end\n"
    "end\n"
    "for _, arg in ipairs{ 1, 12.5, true, {}, print } do\n"
    "  check('decode of a ' .. type(arg), function() return real.decode(arg) end, function() return ours.decode(arg) end)\n"
    "  check('safe decode of a ' .. type(arg), function() return real_safe.decode(arg) end,\n"
    "    function() return ours_safe.decode(arg) end)\n"
    "end\n"
    "check('decode()', function() return real.decode() end, function() return ours.decode() end)\n"
    "check('decode(a, b)', function() return real.decode('1', 2) end, function() return ours.decode('1', 2) end)\n"
    "check('null', function() return real.null, real_safe.null end, function() return ours.null, ours_safe.null end)\n"
    "check('names', function() return real._NAME, real._VERSION, real_safe._NAME end,\n"
    "  function() return ours._NAME, ours._VERSION, ours_safe._NAME end)\n"
    "return passed, failed\n";

static const char encode_cases[] = PRELUDE
    "local cyc = {} cyc[1] = cyc\n"
    "local values = { 'a/b\"c\\\\d\\1\\31\\127\\128\\255 \\195\\169', '', 1/3, 42, -1.5e-7, 2^63, 0/0, 1/0, -1/0,\n"
    "  true, false, real.null, io.stdout, print, coroutine.create(print), {}, {1,2,3}, {1,nil,3},\n"
    "  {[1]=1,[4]=2}, {[10]=1}, {[11]=1}, {[20]=1,[1]=2}, {1,2,x=3}, {[-1]=1}, {[0]=1}, {[1.5]=1},\n"
    "  {[1.5]=1,[2]=2}, {[true]=1}, {[{}]=1}, {[1/0]=1}, {a={b={c={}}}}, cyc, {['1']=1}, {[1e20]=1,x=1},\n"
    "  {[2^53]=1, y=2}, -0.0, 0, 1e15, 1e14, 99999999999999, 123456789012345, -123456, 1e-300, 5e-324,\n"
    "  1.7976931348623157e308, 0.1, 100, 1e100, -1e-5, 2^31, 2^31 - 1, {'x', {y = {'z', {}}}},\n"
    "  { [1] = 'a', [2] = 'b', [3] = 'c', [5] = 'e' }, ('\\0'):rep(3), ('\\t\\n\\r\\b\\f'):rep(2),\n"
    "  ('x'):rep(5000), { ('y'):rep(5000), ('\"'):rep(3000) } }\n"
    "for i, v in ipairs(values) do\n"
    "  check('encode #' .. i .. ' ' .. tostring(v), function() return real.encode(v) end,\n"
    "    function() return ours.encode(v) end)\n"
    "  check('safe encode #' .. i, function() return real_safe.encode(v) end, function() return ours_safe.encode(v) end)\n"
    "end\n"
    "check('encode(nil)', function() return real.encode(nil) end, function() return ours.encode(nil) end)\n"
    "check('encode()', function() return real.encode() end, function() return ours.encode() end)\n"
    "check('encode(1, 2)', function() return real.encode(1, 2) end, function() return ours.encode(1, 2) end)\n"
    "local settings = {\n"
    "  { 'encode_max_depth', 2 }, { 'encode_number_precision', 3 }, { 'encode_number_precision', 1 },\n"
    "  { 'encode_invalid_numbers', true }, { 'encode_invalid_numbers', 'null' }, { 'encode_invalid_numbers', 'on' },\n"
    "  { 'encode_sparse_array', true }, { 'encode_sparse_array', false, 1 }, { 'encode_sparse_array', false, 0 },\n"
    "  { 'encode_sparse_array', true, 3, 1 }, { 'encode_sparse_array', 'on', 2, 100 },\n"
    "  { 'encode_keep_buffer', false }, { 'encode_keep_buffer', 'on' } }\n"
    "local more = { {{}}, {{{}}}, {a={b={}}}, 1/3, 123456, 0/0, 1/0, -1/0, {[1/0]=1, a=1}, {[11]=1}, {1,nil,3},\n"
    "  {[30]=1}, {[4]=1,[1]=1}, {[1]=1,[3]=1}, 1e-7, 12.5, 99, -0.0 }\n"
    "for _, s in ipairs(settings) do\n"
    "  local r, o = real.new(), ours.new()\n"
    "  check('set ' .. s[1], function() return r[s[1]](unpack(s, 2)) end, function() return o[s[1]](unpack(s, 2)) end)\n"
    "  for i, v in ipairs(more) do\n"
    "    check(s[1] .. ' ' .. tostring(s[2]) .. ' #' .. i, function() return r.encode(v) end,\n"
    "      function() return o.encode(v) end)\n"
    "  end\n"
    "end\n"
    "local calls = { { 'encode_sparse_array' }, { 'encode_sparse_array', 1 }, { 'encode_sparse_array', false, -1 },\n"
    "  { 'encode_sparse_array', false, 1.5 }, { 'encode_sparse_array', false, '3' }, { 'encode_sparse_array', false, 2, 3, 4 },\n"
    "  { 'encode_sparse_array', nil, 5 }, { 'encode_sparse_array', false, 2^31 }, { 'encode_sparse_array', false, 'x' },\n"
    "  { 'encode_max_depth' }, { 'encode_max_depth', 0 }, { 'encode_max_depth', 'x' }, { 'encode_max_depth', 1, 2 },\n"
    "  { 'decode_max_depth' }, { 'decode_max_depth', 0 }, { 'decode_max_depth', 7 }, { 'encode_number_precision' },\n"
    "  { 'encode_number_precision', 0 }, { 'encode_number_precision', 15 }, { 'encode_keep_buffer' },\n"
    "  { 'encode_keep_buffer', 1 }, { 'encode_keep_buffer', 'x' }, { 'encode_keep_buffer', 'off' },\n"
    "  { 'encode_invalid_numbers' }, { 'encode_invalid_numbers', 'x' }, { 'encode_invalid_numbers', false },\n"
    "  { 'decode_invalid_numbers' }, { 'decode_invalid_numbers', 'null' }, { 'decode_invalid_numbers', 'on' } }\n"
    "for _, c in ipairs(calls) do\n"
    "  local r, o = real.new(), ours.new()\n"
    "  check(c[1] .. '(' .. show(unpack(c, 2, 4)) .. ')', function() return r[c[1]](unpack(c, 2, 4)) end,\n"
    "    function() return o[c[1]](unpack(c, 2, 4)) end)\n"
    "  check('then ' .. c[1] .. '()', function() return r[c[1]]() end, function() return o[c[1]]() end)\n"
    "end\n"
    "return passed, failed\n";

/* Random values encoded by both, their texts decoded by both, and those
 * texts damaged a byte at a time decoded by both: the same every time. */
static const char random_cases[] = PRELUDE
    "local seed = 12345\n"
    "local function rnd(n) seed = (seed * 1103515245 + 12345) % 2147483648 return seed % n end\n"
    "local alphabet = { 'a', 'b', '\"', '\\\\', '/', '\\n', '\\0', '\\127', '\\200', '\\195\\169', ' ', '1', 'u', '\\t' }\n"
    "local function rstring() local t = {} for i = 1, rnd(12) do t[i] = alphabet[rnd(#alphabet) + 1] end return table.concat(t) end\n"
    "local numbers = { 0, -0.0, 1, -1, 0.5, 1/3, 1e300, -2.5e-300, 123456789, 2^53, 1e14, 99999999999999, 7.0, -1e-7 }\n"
    "local function rvalue(depth)\n"
    "  local k = rnd(depth > 3 and 5 or 8)\n"
    "  if k == 0 then return rstring() elseif k == 1 then return numbers[rnd(#numbers) + 1] + rnd(3)\n"
    "  elseif k == 2 then return rnd(2) == 0 elseif k == 3 then return real.null\n"
    "  elseif k == 4 then return rnd(1000) / 7\n"
    "  elseif k == 5 then local t = {} for i = 1, rnd(5) do t[i] = rvalue(depth + 1) end return t\n"
    "  elseif k == 6 then local t = {} for _ = 1, rnd(5) do t[rstring()] = rvalue(depth + 1) end return t\n"
    "  else local t = {} for _ = 1, rnd(4) do t[rnd(14) + 1] = rvalue(depth + 1) end return t end\n"
    "end\n"
    "local bytes = { '{', '}', '[', ']', ',', ':', '\"', '\\\\', 'u', '0', '-', 'e', 'n', 't', 'f', ' ', '\\0', 'x', 'd8' }\n"
    "for i = 1, 2000 do\n"
    "  local v = rvalue(0)\n"
    "  local ok, text = pcall(real.encode, v)\n"
    "  check('random encode #' .. i, function() return real.encode(v) end, function() return ours.encode(v) end)\n"
    "  if ok then\n"
    "    check('random decode #' .. i, function() return real.decode(text) end, function() return ours.decode(text) end)\n"
    "    for _ = 1, 3 do\n"
    "      local at = rnd(#text + 1) + 1\n"
    "      local bad = text:sub(1, at - 1) .. bytes[rnd(#bytes) + 1] .. text:sub(at + rnd(2))\n"
    "      check('damaged ' .. ('%q'):format(bad), function() return real.decode(bad) end,\n"
    "        function() return ours.decode(bad) end)\n"
    "    end\n"
    "  end\n"
    "end\n"
    "return passed, failed\n";

static lua_State *
new_state(bounded_t *b)
{
    lua_State *L = lua_newstate(test_alloc, b);

    luaL_openlibs(L);
    return L;
}

/* The module against lua-cjson, in one state: cjson loaded first, then
 * ours over package.loaded. */
static void
test_same_as_cjson(void)
{
    bounded_t b = { 0, (size_t) -1, 0 };
    lua_State *L = new_state(&b);

    if (luaL_dostring(L, "return require('cjson'), require('cjson.safe')") != 0) {
        UNIT_CASE("lua-cjson is there to compare with");
        UNIT_CHECK(!"require('cjson') failed: is lua-cjson installed?");
        lua_close(L);
        return;
    }
    lua_setfield(L, LUA_REGISTRYINDEX, "real_safe");
    lua_setfield(L, LUA_REGISTRYINDEX, "real");
    ric_script_json_open(L);
    (void) luaL_dostring(L, "return require('cjson'), require('cjson.safe')");
    lua_setfield(L, LUA_REGISTRYINDEX, "ours_safe");
    lua_setfield(L, LUA_REGISTRYINDEX, "ours");
    run_lua(L, "decode", decode_cases);
    run_lua(L, "encode", encode_cases);
    run_lua(L, "random", random_cases);
    lua_close(L);
}

/* Runs code (a chunk returning cjson's results) protected; the error
 * message, or NULL. */
static const char *
run(lua_State *L, const char *code)
{
    lua_settop(L, 0);
    if (luaL_loadstring(L, code) != 0 || lua_pcall(L, 0, LUA_MULTRET, 0) != 0) {
        return lua_tostring(L, -1);
    }
    return NULL;
}

/* What the state holds once its garbage is collected (LuaJIT's own
 * string buffer shrinks a little each cycle: never more than before). */
static size_t
collected(lua_State *L, bounded_t *b)
{
    lua_settop(L, 0);
    lua_gc(L, LUA_GCCOLLECT, 0);
    lua_gc(L, LUA_GCCOLLECT, 0);
    return b->bytes;
}

/* What the bound refuses mid-call is given back whole: the output of an
 * encode (a table naming one large string many times, far larger than
 * the state may hold) and the strings and tables of a decode. */
static void
test_memory(void)
{
    bounded_t b = { 0, (size_t) -1, 0 };
    lua_State *L = new_state(&b);
    const char *err;
    size_t base;

    ric_script_json_open(L);
    run(L, "big = ('x'):rep(1048576) many = {} for i = 1, 200 do many[i] = big end "
           "local parts = {} for i = 1, 10 do "
           "  parts[i] = '[\"' .. ('\\\\n'):rep(400000) .. i .. '\",{\"a\":[1,2,3]}]' end "
           "text = '[' .. table.concat(parts, ',') .. ',1]' cjson = require('cjson')");
    base = collected(L, &b);
    b.limit = base + (16 << 20);

    UNIT_CASE("an encode over the bound is refused and holds nothing after");
    b.refused = 0;
    err = run(L, "return cjson.encode(many)");
    UNIT_CHECK(err != NULL && strstr(err, "not enough memory") != NULL);
    UNIT_CHECK(b.refused);
    UNIT_CHECK(collected(L, &b) <= base);

    UNIT_CASE("cjson.safe passes a memory error on: it is no nil, message");
    b.refused = 0;
    err = run(L, "return require('cjson.safe').encode(many)");
    UNIT_CHECK(err != NULL && strstr(err, "not enough memory") != NULL);
    UNIT_CHECK(collected(L, &b) <= base);

    UNIT_CASE("a decode over the bound holds nothing after");
    b.limit = base + (2 << 20);
    b.refused = 0;
    err = run(L, "return cjson.decode(text)");
    UNIT_CHECK(err != NULL && strstr(err, "not enough memory") != NULL);
    UNIT_CHECK(b.refused);
    UNIT_CHECK(collected(L, &b) <= base);

    UNIT_CASE("an encode that fails on its own gives its output back at once");
    b.limit = (size_t) -1;
    err = run(L, "local t = { big, big, big, big, print } "
                 "local ok, e = pcall(cjson.encode, t) return e");
    UNIT_CHECK(err == NULL && strcmp(lua_tostring(L, -1),
                                     "Cannot serialise function: type not supported") == 0);
    lua_settop(L, 0);
    UNIT_CHECK(b.bytes < base + (1 << 20));

    UNIT_CASE("within the bound, both work");
    b.limit = base + (64 << 20);
    err = run(L, "return #cjson.encode({ big, big }), #cjson.decode(text)");
    UNIT_CHECK(err == NULL);
    UNIT_CHECK_INT(lua_tointeger(L, 1), 2 * 1048576 + 7);
    UNIT_CHECK_INT(lua_tointeger(L, 2), 11);
    UNIT_CHECK(collected(L, &b) <= base);
    lua_close(L);
}

/* No setting makes a call unbounded: depth past RIC_JSON_MAX_DEPTH is
 * refused, a sparse array past RIC_JSON_ARRAY_MAX too, with sparse
 * checks off (the setting that made lua-cjson loop for ever). */
static void
test_settings(void)
{
    bounded_t b = { 0, (size_t) -1, 0 };
    lua_State *L = new_state(&b);
    const char *err;

    ric_script_json_open(L);
    UNIT_CASE("depth settings past 1000 are refused");
    err = run(L, "return require('cjson').decode_max_depth(1001)");
    UNIT_CHECK(err != NULL && strstr(err, "expected integer between 1 and 1000") != NULL);
    err = run(L, "return require('cjson').encode_max_depth(2^31 - 1)");
    UNIT_CHECK(err != NULL && strstr(err, "expected integer between 1 and 1000") != NULL);
    err = run(L, "return require('cjson').encode_sparse_array(false, 2^40)");
    UNIT_CHECK(err != NULL && strstr(err, "expected integer between 0 and 2147483647") != NULL);

    UNIT_CASE("encode_sparse_array(false, 0, 0) cannot make encode loop");
    err = run(L, "local c = require('cjson') c.encode_sparse_array(false, 0, 0) "
                 "return pcall(c.encode, { [2^31 - 1] = 1 })");
    UNIT_CHECK(err == NULL && !lua_toboolean(L, 1));
    UNIT_CHECK_STR(lua_tostring(L, 2), "Cannot serialise table: array index 2147483647 is over "
                                       "16777216");
    err = run(L, "local c = require('cjson') c.encode_sparse_array(false, 0, 0) "
                 "return c.encode({ [2^40] = 1 })");
    UNIT_CHECK(err == NULL);
    UNIT_CHECK_STR(lua_tostring(L, 1), "{\"1099511627776\":1}");
    err = run(L, "local c = require('cjson') c.encode_sparse_array(false, 0, 0) "
                 "return c.encode({ [5] = 1 })");
    UNIT_CHECK(err == NULL);
    UNIT_CHECK_STR(lua_tostring(L, 1), "[null,null,null,null,1]");
    lua_close(L);
}

/* The clock is looked at as a call runs, not only between calls: a
 * guard that stops stops it (cjson.safe too), and nothing is held. */
static void
test_guard_called(void)
{
    bounded_t b = { 0, (size_t) -1, 0 };
    lua_State *L = new_state(&b);
    const char *err;
    size_t base;

    ric_script_json_open(L);
    ric_script_deadline_init(test_over, test_stop);
    run(L, "text = '[' .. ('1,'):rep(100000) .. '1]' value = require('cjson').decode(text)");
    base = collected(L, &b);

    UNIT_CASE("a long decode checks the clock as it goes");
    guard_calls = 0;
    err = run(L, "return require('cjson').decode(text)");
    UNIT_CHECK(err == NULL);
    UNIT_CHECK(guard_calls >= 20);

    UNIT_CASE("a long encode checks the clock as it goes");
    guard_calls = 0;
    err = run(L, "return require('cjson').encode(value)");
    UNIT_CHECK(err == NULL);
    UNIT_CHECK(guard_calls >= 20);

    UNIT_CASE("a stop inside the safe module is raised, not returned");
    guard_calls = 0;
    guard_stop_after = 3;
    err = run(L, "return require('cjson.safe').decode(text)");
    UNIT_CHECK(err != NULL && strstr(err, "stopped") != NULL);
    guard_calls = 0;
    err = run(L, "return require('cjson.safe').encode(value)");
    UNIT_CHECK(err != NULL && strstr(err, "stopped") != NULL);
    guard_stop_after = -1;
    lua_settop(L, 0);
    lua_gc(L, LUA_GCCOLLECT, 0);
    UNIT_CHECK(collected(L, &b) <= base);

    UNIT_CASE("every call checks the clock at its end");
    guard_calls = 0;
    err = run(L, "local c = require('cjson') for i = 1, 10 do c.decode('[1]') c.encode({}) end");
    UNIT_CHECK(err == NULL);
    UNIT_CHECK_INT(guard_calls, 20);
    ric_script_deadline_init(NULL, NULL);
    lua_close(L);
}

int
main(void)
{
    test_same_as_cjson();
    test_memory();
    test_settings();
    test_guard_called();
    return UNIT_DONE("script_json");
}
