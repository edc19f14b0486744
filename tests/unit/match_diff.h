/* match_diff.h: runs a call of find, match, gmatch or gsub through LuaJIT's string library and through
 * script_match.c's, and says whether they agree (shared by test_script_match.c and fuzz_match.c). */
#ifndef RIC_MATCH_DIFF_H
#define RIC_MATCH_DIFF_H

#include "script_match.h"

#include <lauxlib.h>
#include <lualib.h>

/* The Lua side: diff(fname, subject, pattern, a3, a4) -> nil when both agree, else a text saying how they
 * differ. a3 "FN" and "TBL" stand for a replacement function and table (their calls are compared too). */
static const char match_diff_lua[] =
    "local ours = ...\n"
    "local function pack(ok, ...) return { ok = ok, n = select('#', ...), ... } end\n"
    "local function show(r)\n"
    "  if not r.ok then\n"
    "    local m = tostring(r[1]):gsub('^[^\\n]-:%d+: ', ''):gsub(\"to '[^']*'\", 'to ?')\n"
    "    return 'error: ' .. m\n"
    "  end\n"
    "  local out = {}\n"
    "  for i = 1, r.n do out[#out + 1] = type(r[i]) .. ':' .. string.format('%q', tostring(r[i])) end\n"
    "  return table.concat(out, ',')\n"
    "end\n"
    "local function run(lib, fname, s, p, a3, a4)\n"
    "  local calls = {}\n"
    "  local repl = a3\n"
    "  if a3 == 'FN' then\n"
    "    repl = function(...) calls[#calls + 1] = show(pack(true, ...)); if (...) == 'a' then return false end\n"
    "      return (...) == 'b' and 7 or (...) end\n"
    "  elseif a3 == 'TBL' then\n"
    "    repl = setmetatable({}, { __index = function(_, k) calls[#calls + 1] = tostring(k)\n"
    "      return k == 'a' and 'X' or (k == 'b' and {} or nil) end })\n"
    "  end\n"
    "  local r\n"
    "  if fname == 'gmatch' then\n"
    "    local got = pack(pcall(lib.gmatch, s, p))\n"
    "    if not got.ok then return show(got) end\n"
    "    local out = {}\n"
    "    for _ = 1, 200 do\n"
    "      local x = pack(pcall(got[1]))\n"
    "      out[#out + 1] = show(x)\n"
    "      if not x.ok or x.n == 0 then break end\n"
    "    end\n"
    "    return table.concat(out, ' | ')\n"
    "  elseif fname == 'gsub' then\n"
    "    r = pack(pcall(lib.gsub, s, p, repl, a4))\n"
    "  elseif a4 ~= nil then\n"
    "    r = pack(pcall(lib[fname], s, p, a3, a4))\n"
    "  elseif a3 ~= nil then\n"
    "    r = pack(pcall(lib[fname], s, p, a3))\n"
    "  else\n"
    "    r = pack(pcall(lib[fname], s, p))\n"
    "  end\n"
    "  return show(r) .. ' calls ' .. table.concat(calls, ';')\n"
    "end\n"
    "return function(fname, s, p, a3, a4)\n"
    "  local want, got = run(string, fname, s, p, a3, a4), run(ours, fname, s, p, a3, a4)\n"
    "  if want == got then return nil end\n"
    "  return string.format('%s(%q, %q, %s, %s): LuaJIT %s, ours %s', fname, s, p, tostring(a3),\n"
    "    tostring(a4), want, got)\n"
    "end\n";

/* A state with the diff function at the top of its stack, or NULL. */
static lua_State *
match_diff_state(void)
{
    lua_State *L = luaL_newstate();

    if (L == NULL) {
        return NULL;
    }
    luaL_openlibs(L);
    if (luaL_loadstring(L, match_diff_lua) != 0) {
        lua_close(L);
        return NULL;
    }
    ric_script_match_push(L);
    if (lua_pcall(L, 1, 1, 0) != 0) {
        lua_close(L);
        return NULL;
    }
    return L;
}

#endif
