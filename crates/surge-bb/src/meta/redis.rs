//! `MetaStore` on Redis: every mutation is one Lua script, which Redis runs
//! atomically. Keys (all under the prefix `bb:{fs}:`):
//! - `meta` hash: chunk_size; `next_ino`, `clients` counters
//! - `i:{ino}` hash: attributes (k, mode, uid, gid, size, mt, ct, at, nl, gen,
//!   pgen, par, name, imp, implen, xkey)
//! - `d:{ino}` hash: name -> child inode (the (parent, name) namespace)
//! - `c:{ino}` hash: chunk index -> `ver:len:persisted:holder,holder`
//! - `dirty` zset: `ino:idx:ver` scored by the ms it was logged (the dirty log)
//! - `pub` zset: inodes to publish; `unpub` set: export keys to delete;
//!   `xk` hash: export key -> inode; `del:{key}`: a delete in progress
//! - `nodes` zset: node addr scored by lease expiry (ms); `nodeinfo` hash
//!
//! On Redis Cluster (a `redis+cluster://host:port,host:port/` URL) the
//! prefix is a hash tag, `bb:{fs}:`, so every key of one file system is in
//! one slot and every script stays one atomic step on one master, exactly
//! as on a single Redis (see docs/burst-buffer.md, "Metadata on Redis Cluster").
//!
//! Connections are pooled; a dropped connection is retried (Redis restarting)
//! until `retry_for` runs out, then the call fails with `Unavailable`. Scripts
//! are idempotent under such retries: inode numbers and chunk versions are
//! chosen by the caller, so a replayed create or commit finds its own result.

use super::*;
use parking_lot::Mutex;
use ::redis::{Connection, RedisError, Script, Value};
use std::collections::HashMap;
use std::sync::LazyLock;
use std::time::{Duration, Instant};

const PRELUDE: &str = r#"
local P = ARGV[1]
-- An inode's keys are in shard ino / 2^40 (shard 0 on an unsharded store).
local function shard_of(ino) return math.floor(tonumber(ino) / 1099511627776) end
local function sharded() return redis.call('HEXISTS', P..'meta', 'sharded') == 1 end
-- A cross-slot change of dir/name is in flight (see `settle`).
local function busy(dir, name) return redis.call('HEXISTS', P..'x', dir..'/'..name) == 1 end
local function ver_of(e) if not e then return nil end return string.match(e, '^(%d+):') end
local function is_persisted(e) return string.match(e, '^%d+:%d+:1:') ~= nil end
local function drop_export(ino)
  local xkey = redis.call('HGET', P..'i:'..ino, 'xkey')
  if xkey and xkey ~= '' then
    if sharded() then
      -- The export-key map is global (another slot): queued here, applied by `claim_unpublish`.
      redis.call('SADD', P..'unpubq', ino..'/'..xkey)
      return
    end
    if redis.call('HGET', P..'xk', xkey) == ino then redis.call('HDEL', P..'xk', xkey) end
    redis.call('SADD', P..'unpub', xkey)
  end
end
local function remove_inode(ino)
  local out = {ino}
  local cm = redis.call('HGETALL', P..'c:'..ino)
  for i = 1, #cm, 2 do
    redis.call('ZREM', P..'dirty', ino..':'..cm[i]..':'..ver_of(cm[i+1]))
    table.insert(out, cm[i]); table.insert(out, cm[i+1])
  end
  drop_export(ino)
  redis.call('ZREM', P..'pub', ino)
  redis.call('DEL', P..'i:'..ino, P..'c:'..ino, P..'d:'..ino)
  return out
end
local function touch(ino, now) redis.call('HSET', P..'i:'..ino, 'mt', now, 'ct', now) end
"#;

fn script(body: &str) -> Script {
    Script::new(&format!("{PRELUDE}\n{body}"))
}

// KEYS: the inode; ARGV: field, value... Returns the inode after (HGETALL),
// or nothing when it does not exist (an HSET would resurrect it).
static SETATTR: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        "if redis.call('EXISTS', KEYS[1]) == 0 then return {} end redis.call('HSET', KEYS[1], unpack(ARGV)) return redis.call('HGETALL', KEYS[1])",
    )
});

// ARGV: P, parent, name. Returns {ino, HGETALL of the inode}: one round trip.
static LOOKUP: LazyLock<Script> = LazyLock::new(|| {
    script(
        r#"
local ino = redis.call('HGET', P..'d:'..ARGV[2], ARGV[3])
if busy(ARGV[2], ARGV[3]) then return redis.error_reply('EINTENT') end
if ino then
  -- An inode of another shard (a directory, a file moved here): the caller reads it there.
  if shard_of(ino) ~= shard_of(ARGV[2]) then return {ino, {}} end
  return {ino, redis.call('HGETALL', P..'i:'..ino)}
end
-- Tell "no such name" from "the parent is not a directory".
local pkind = redis.call('HGET', P..'i:'..ARGV[2], 'k')
if pkind and pkind ~= 'd' then return redis.error_reply('ENOTDIR') end
return redis.error_reply('ENOENT')
"#,
    )
});

// ARGV: P, ino, max depth. Returns {HGETALL of the inode, then parent, name
// of each directory above it up to the root's child}: one round trip.
static GETATTR_WITH_ANCESTORS: LazyLock<Script> = LazyLock::new(|| {
    script(
        r#"
local out = {redis.call('HGETALL', P..'i:'..ARGV[2])}
local dir = redis.call('HGET', P..'i:'..ARGV[2], 'par')
local n = 0
while dir and dir ~= '1' and dir ~= '0' and n < tonumber(ARGV[3]) do
  local pn = redis.call('HMGET', P..'i:'..dir, 'par', 'name')
  if not pn[1] then return redis.error_reply('ENOENT') end
  table.insert(out, dir); table.insert(out, pn[1]); table.insert(out, pn[2] or '')
  dir = pn[1]
  n = n + 1
end
return out
"#,
    )
});

// ARGV: P, parent, name, ino, kind, mode, uid, gid, now_ns, now_ms. Returns the new inode (HGETALL).
static CREATE: LazyLock<Script> = LazyLock::new(|| {
    script(
        r#"
local parent, name, ino, kind = ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local pk = P..'i:'..parent
local pkind = redis.call('HGET', pk, 'k')
if not pkind then return redis.error_reply('ENOENT') end
if pkind ~= 'd' then return redis.error_reply('ENOTDIR') end
-- A directory being removed takes no new names.
if redis.call('HEXISTS', pk, 'cl') == 1 then return redis.error_reply('ENOENT') end
if busy(parent, name) then return redis.error_reply('EINTENT') end
local cur = redis.call('HGET', P..'d:'..parent, name)
if cur then
  -- A retry of this very create (its reply was lost): done already.
  if cur == ino then return redis.call('HGETALL', P..'i:'..ino) end
  return redis.error_reply('EEXIST')
end
redis.call('HSET', P..'d:'..parent, name, ino)
local nl = 1
local gen = 1
if kind == 'd' then nl = 2; gen = 0; redis.call('HINCRBY', pk, 'nl', 1) end
redis.call('HSET', P..'i:'..ino, 'k', kind, 'mode', ARGV[6], 'uid', ARGV[7], 'gid', ARGV[8], 'size', 0,
  'mt', ARGV[9], 'ct', ARGV[9], 'at', ARGV[9], 'nl', nl, 'gen', gen, 'pgen', 0, 'par', parent, 'name', name)
-- Files get their export object, directories their marker (`dir/`).
redis.call('ZADD', P..'pub', 'NX', ARGV[10], ino)
touch(parent, ARGV[9])
return redis.call('HGETALL', P..'i:'..ino)
"#,
    )
});

// ARGV: P, parent, name, now_ns, want_dir
static UNLINK: LazyLock<Script> = LazyLock::new(|| {
    script(
        r#"
local parent, name = ARGV[2], ARGV[3]
local ino = redis.call('HGET', P..'d:'..parent, name)
if not ino then return redis.error_reply('ENOENT') end
if busy(parent, name) then return redis.error_reply('EINTENT') end
if shard_of(ino) ~= shard_of(parent) then return {'XS', ino} end
local k = redis.call('HGET', P..'i:'..ino, 'k')
if ARGV[5] == '1' then
  if k ~= 'd' then return redis.error_reply('ENOTDIR') end
  if redis.call('HLEN', P..'d:'..ino) > 0 then return redis.error_reply('ENOTEMPTY') end
  redis.call('HINCRBY', P..'i:'..parent, 'nl', -1)
elseif k == 'd' then
  return redis.error_reply('EISDIR')
end
redis.call('HDEL', P..'d:'..parent, name)
touch(parent, ARGV[4])
return remove_inode(ino)
"#,
    )
});

// ARGV: P, sp, sn, dp, dn, now_ns, now_ms
static RENAME: LazyLock<Script> = LazyLock::new(|| {
    script(
        r#"
local sp, sn, dp, dn, now = ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6]
local src = redis.call('HGET', P..'d:'..sp, sn)
if not src then return redis.error_reply('ENOENT') end
local dk = redis.call('HGET', P..'i:'..dp, 'k')
if not dk then return redis.error_reply('ENOENT') end
if dk ~= 'd' then return redis.error_reply('ENOTDIR') end
if busy(sp, sn) or busy(dp, dn) then return redis.error_reply('EINTENT') end
if redis.call('HEXISTS', P..'i:'..dp, 'cl') == 1 then return redis.error_reply('ENOENT') end
local dst0 = redis.call('HGET', P..'d:'..dp, dn)
-- An inode in another shard: the caller runs the cross-slot rename.
if shard_of(src) ~= shard_of(sp) or (dst0 and shard_of(dst0) ~= shard_of(sp)) then return {'XS'} end
local sk = redis.call('HGET', P..'i:'..src, 'k')
if sk == 'd' then
  local a = dp
  while a and a ~= '0' do
    if a == src then return redis.error_reply('EINVAL') end
    a = redis.call('HGET', P..'i:'..a, 'par')
  end
end
local dst = redis.call('HGET', P..'d:'..dp, dn)
local out = {}
if dst then
  if dst == src then return {} end
  local tk = redis.call('HGET', P..'i:'..dst, 'k')
  if sk == 'd' then
    if tk ~= 'd' then return redis.error_reply('ENOTDIR') end
    if redis.call('HLEN', P..'d:'..dst) > 0 then return redis.error_reply('ENOTEMPTY') end
    redis.call('HINCRBY', P..'i:'..dp, 'nl', -1)
  elseif tk == 'd' then
    return redis.error_reply('EISDIR')
  end
  out = remove_inode(dst)
end
redis.call('HDEL', P..'d:'..sp, sn)
redis.call('HSET', P..'d:'..dp, dn, src)
redis.call('HSET', P..'i:'..src, 'par', dp, 'name', dn, 'ct', now)
if sk == 'd' and sp ~= dp then
  redis.call('HINCRBY', P..'i:'..sp, 'nl', -1)
  redis.call('HINCRBY', P..'i:'..dp, 'nl', 1)
end
touch(sp, now); touch(dp, now)
redis.call('ZADD', P..'pub', ARGV[7], src)
return out
"#,
    )
});

// Installs entries after checking every base. ARGV: P, ino, end, now_ns, now_ms, bump, n, (idx, base, entry)*
static COMMIT: LazyLock<Script> = LazyLock::new(|| {
    script(
        r#"
local ino, now, nowms, bump, n = ARGV[2], ARGV[4], ARGV[5], ARGV[6], tonumber(ARGV[7])
local ik, ck = P..'i:'..ino, P..'c:'..ino
local k = redis.call('HGET', ik, 'k')
if not k then return redis.error_reply('ENOENT') end
if k ~= 'f' then return redis.error_reply('EISDIR') end
local curs = {}
for j = 0, n - 1 do
  local idx, base, entry = ARGV[8+3*j], ARGV[9+3*j], ARGV[10+3*j]
  local cur = redis.call('HGET', ck, idx)
  local cv = ver_of(cur) or '0'
  if cv ~= base and cv ~= ver_of(entry) then return redis.error_reply('ECONFLICT '..idx) end
  curs[j] = cur
end
local out = {}
local applied = 0
for j = 0, n - 1 do
  local idx, entry = ARGV[8+3*j], ARGV[10+3*j]
  local cur = curs[j]
  local nv = ver_of(entry)
  if ver_of(cur) ~= nv then
    redis.call('HSET', ck, idx, entry)
    if cur then
      redis.call('ZREM', P..'dirty', ino..':'..idx..':'..ver_of(cur))
      table.insert(out, idx); table.insert(out, cur)
    end
    if not is_persisted(entry) then redis.call('ZADD', P..'dirty', 'NX', nowms, ino..':'..idx..':'..nv) end
    applied = applied + 1
  end
end
if applied > 0 and bump == '1' then
  local size = tonumber(redis.call('HGET', ik, 'size'))
  if tonumber(ARGV[3]) > size then redis.call('HSET', ik, 'size', ARGV[3]) end
  touch(ino, now)
  redis.call('HINCRBY', ik, 'gen', 1)
  redis.call('ZADD', P..'pub', 'NX', nowms, ino)
end
return out
"#,
    )
});

// ARGV: P, ino, size, now_ns, now_ms, chunk_size, tail_idx, tail_base, tail_entry ('' = none)
static TRUNCATE: LazyLock<Script> = LazyLock::new(|| {
    script(
        r#"
local ino, size, now, nowms, cs = ARGV[2], tonumber(ARGV[3]), ARGV[4], ARGV[5], tonumber(ARGV[6])
local ik, ck = P..'i:'..ino, P..'c:'..ino
local k = redis.call('HGET', ik, 'k')
if not k then return redis.error_reply('ENOENT') end
if k ~= 'f' then return redis.error_reply('EISDIR') end
local tidx, tbase, tentry = ARGV[7], ARGV[8], ARGV[9]
local out = {}
if tentry ~= '' then
  local cur = redis.call('HGET', ck, tidx)
  local cv = ver_of(cur) or '0'
  if cv ~= tbase and cv ~= ver_of(tentry) then return redis.error_reply('ECONFLICT '..tidx) end
  if cv ~= ver_of(tentry) then
    redis.call('HSET', ck, tidx, tentry)
    if cur then
      redis.call('ZREM', P..'dirty', ino..':'..tidx..':'..cv)
      table.insert(out, tidx); table.insert(out, cur)
    end
    if not is_persisted(tentry) then redis.call('ZADD', P..'dirty', 'NX', nowms, ino..':'..tidx..':'..ver_of(tentry)) end
  end
end
local keep = math.ceil(size / cs)
local cm = redis.call('HGETALL', ck)
for i = 1, #cm, 2 do
  if tonumber(cm[i]) >= keep then
    redis.call('HDEL', ck, cm[i])
    redis.call('ZREM', P..'dirty', ino..':'..cm[i]..':'..ver_of(cm[i+1]))
    table.insert(out, cm[i]); table.insert(out, cm[i+1])
  end
end
local implen = redis.call('HGET', ik, 'implen')
if implen and tonumber(implen) > size then redis.call('HSET', ik, 'implen', size) end
redis.call('HSET', ik, 'size', size)
touch(ino, now)
redis.call('HINCRBY', ik, 'gen', 1)
redis.call('ZADD', P..'pub', 'NX', nowms, ino)
return out
"#,
    )
});

// ARGV: P, ino, idx, ver
static MARK_PERSISTED: LazyLock<Script> = LazyLock::new(|| {
    script(
        r#"
local ino, idx, ver = ARGV[2], ARGV[3], ARGV[4]
redis.call('ZREM', P..'dirty', ino..':'..idx..':'..ver)
local cur = redis.call('HGET', P..'c:'..ino, idx)
if not cur or ver_of(cur) ~= ver then return 0 end
local v, l, h = string.match(cur, '^(%d+):(%d+):%d:(.*)$')
redis.call('HSET', P..'c:'..ino, idx, v..':'..l..':1:'..h)
return 1
"#,
    )
});

// ARGV: P, ino, idx, ver, holders
static SET_HOLDERS: LazyLock<Script> = LazyLock::new(|| {
    script(
        r#"
local ino, idx, ver = ARGV[2], ARGV[3], ARGV[4]
local cur = redis.call('HGET', P..'c:'..ino, idx)
if not cur or ver_of(cur) ~= ver then return 0 end
local v, l, p, h = string.match(cur, '^(%d+):(%d+):(%d):(.*)$')
if h ~= ARGV[5] then return 0 end
redis.call('HSET', P..'c:'..ino, idx, v..':'..l..':'..p..':'..ARGV[6])
return 1
"#,
    )
});

// ARGV: P, ino, idx, ver, addr. Removes addr from the holders of the current
// version, unless it would leave a version not in S3 with no holder.
static DROP_HOLDER: LazyLock<Script> = LazyLock::new(|| {
    script(
        r#"
local ino, idx, ver, addr = ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local cur = redis.call('HGET', P..'c:'..ino, idx)
if not cur or ver_of(cur) ~= ver then return 0 end
local v, l, p, h = string.match(cur, '^(%d+):(%d+):(%d):(.*)$')
local rest, found = {}, false
for x in string.gmatch(h, '[^,]+') do
  if x == addr then found = true else table.insert(rest, x) end
end
if not found or (p ~= '1' and #rest == 0) then return 0 end
redis.call('HSET', P..'c:'..ino, idx, v..':'..l..':'..p..':'..table.concat(rest, ','))
return 1
"#,
    )
});

// ARGV: P, ino, gen, xkey, clear_import, now_ms
static MARK_PUBLISHED: LazyLock<Script> = LazyLock::new(|| {
    script(
        r#"
local ino, gen, xkey = ARGV[2], ARGV[3], ARGV[4]
local ik = P..'i:'..ino
local cur = redis.call('HGET', ik, 'gen')
if cur ~= gen or redis.call('EXISTS', P..'del:'..xkey) == 1 then
  redis.call('ZADD', P..'pub', ARGV[6], ino)
  return 0
end
local old = redis.call('HGET', ik, 'xkey')
if old and old ~= '' and old ~= xkey then
  if redis.call('HGET', P..'xk', old) == ino then redis.call('HDEL', P..'xk', old) end
  redis.call('SADD', P..'unpub', old)
end
redis.call('HSET', ik, 'pgen', gen, 'xkey', xkey)
redis.call('HSET', P..'xk', xkey, ino)
redis.call('SREM', P..'unpub', xkey)
if ARGV[5] == '1' then redis.call('HDEL', ik, 'imp', 'implen') end
redis.call('ZREM', P..'pub', ino)
return 1
"#,
    )
});

// ARGV: P
static CLAIM_UNPUB: LazyLock<Script> = LazyLock::new(|| {
    script(
        r#"
while true do
  local key = redis.call('SPOP', P..'unpub')
  if not key then return false end
  if not redis.call('HGET', P..'xk', key) then
    redis.call('SET', P..'del:'..key, '1', 'PX', 600000)
    return key
  end
end
"#,
    )
});

// ARGV: P, parent, name, ino, key, size, now_ns
static IMPORT: LazyLock<Script> = LazyLock::new(|| {
    script(
        r#"
local parent, name, ino, key = ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local pk = P..'i:'..parent
local pkind = redis.call('HGET', pk, 'k')
if not pkind then return redis.error_reply('ENOENT') end
if pkind ~= 'd' then return redis.error_reply('ENOTDIR') end
if redis.call('HEXISTS', pk, 'cl') == 1 then return redis.error_reply('ENOENT') end
if busy(parent, name) then return redis.error_reply('EINTENT') end
local cur = redis.call('HGET', P..'d:'..parent, name)
if cur then return cur end
redis.call('HSET', P..'d:'..parent, name, ino)
redis.call('HSET', P..'i:'..ino, 'k', 'f', 'mode', 420, 'uid', 0, 'gid', 0, 'size', ARGV[6],
  'mt', ARGV[7], 'ct', ARGV[7], 'at', ARGV[7], 'nl', 1, 'gen', 1, 'pgen', 1, 'par', parent, 'name', name,
  'imp', key, 'implen', ARGV[6], 'xkey', key)
-- Sharded: the caller has set the global export-key map first.
if not sharded() then redis.call('HSET', P..'xk', key, ino) end
return ino
"#,
    )
});

// ---- Cross-slot changes of a sharded store (see `settle`). Each runs in
// one shard; each is idempotent, so any number of settlers may replay it.

// Step 1 of a mkdir whose directory lives in another shard, in the parent's
// shard: the entry, the parent's link count and the intent, at once.
// ARGV: P, parent, name, ino, intent, now_ns
static MKDIR1: LazyLock<Script> = LazyLock::new(|| {
    script(
        r#"
local parent, name, ino = ARGV[2], ARGV[3], ARGV[4]
local pk = P..'i:'..parent
local pkind = redis.call('HGET', pk, 'k')
if not pkind then return redis.error_reply('ENOENT') end
if pkind ~= 'd' then return redis.error_reply('ENOTDIR') end
if redis.call('HEXISTS', pk, 'cl') == 1 then return redis.error_reply('ENOENT') end
local cur = redis.call('HGET', P..'d:'..parent, name)
if cur == ino then return 'OK' end
if busy(parent, name) then return redis.error_reply('EINTENT') end
if cur then return redis.error_reply('EEXIST') end
redis.call('HSET', P..'d:'..parent, name, ino)
redis.call('HINCRBY', pk, 'nl', 1)
touch(parent, ARGV[6])
redis.call('HSET', P..'x', parent..'/'..name, ARGV[5])
return 'OK'
"#,
    )
});

// Step 2 of that mkdir, in the new directory's shard. ARGV: P, ino, parent,
// name, mode, uid, gid, now_ns, now_ms. Returns the inode (HGETALL).
static MKDIR2: LazyLock<Script> = LazyLock::new(|| {
    script(
        r#"
local ik = P..'i:'..ARGV[2]
if redis.call('EXISTS', ik) == 0 then
  redis.call('HSET', ik, 'k', 'd', 'mode', ARGV[5], 'uid', ARGV[6], 'gid', ARGV[7], 'size', 0,
    'mt', ARGV[8], 'ct', ARGV[8], 'at', ARGV[8], 'nl', 2, 'gen', 0, 'pgen', 0, 'par', ARGV[3], 'name', ARGV[4])
  redis.call('ZADD', P..'pub', 'NX', ARGV[9], ARGV[2])
end
return redis.call('HGETALL', ik)
"#,
    )
});

// The last step of every protocol: drops its intent (or marker), if still
// this one. ARGV: P, field, value
static CLEAR_INTENT: LazyLock<Script> = LazyLock::new(|| {
    script(
        r#"
if redis.call('HGET', P..'x', ARGV[2]) == ARGV[3] then redis.call('HDEL', P..'x', ARGV[2]) end
return 1
"#,
    )
});

// Step 1 of an rmdir, unlink or rename across shards: the intent on
// dir/name, if the name still names `ino`. ARGV: P, dir, name, ino, intent
static INTENT_AT: LazyLock<Script> = LazyLock::new(|| {
    script(
        r#"
local f = ARGV[2]..'/'..ARGV[3]
local x = redis.call('HGET', P..'x', f)
if x == ARGV[5] then return 'OK' end
if x then return redis.error_reply('EINTENT') end
local cur = redis.call('HGET', P..'d:'..ARGV[2], ARGV[3])
if not cur then return redis.error_reply('ENOENT') end
if cur ~= ARGV[4] then return 'ECHANGED' end
redis.call('HSET', P..'x', f, ARGV[5])
return 'OK'
"#,
    )
});

// Closes an empty directory for removal by change `id` (creates in it are
// refused from now on), once: the verdict is kept on the inode, so every
// settler of `id` gets the same one. ARGV: P, ino, id
static CLOSE: LazyLock<Script> = LazyLock::new(|| {
    script(
        r#"
local ino, id = ARGV[2], ARGV[3]
local ik = P..'i:'..ino
local k = redis.call('HGET', ik, 'k')
if not k then return 'gone' end
local v = redis.call('HGET', ik, 'v:'..id)
if v then return v end
local cl = redis.call('HGET', ik, 'cl')
local r = 'ok'
if k ~= 'd' then r = 'ENOTDIR'
elseif cl and cl ~= id then r = 'ENOENT'
elseif redis.call('HLEN', P..'d:'..ino) > 0 then r = 'ENOTEMPTY' end
if r == 'ok' then redis.call('HSET', ik, 'cl', id) end
redis.call('HSET', ik, 'v:'..id, r)
return r
"#,
    )
});

// Reopens a directory closed by `id` (a rename that did not go through). ARGV: P, ino, id
static REOPEN: LazyLock<Script> = LazyLock::new(|| {
    script(
        r#"
local ik = P..'i:'..ARGV[2]
if redis.call('HGET', ik, 'cl') == ARGV[3] then redis.call('HDEL', ik, 'cl') end
return 1
"#,
    )
});

// Removes an inode: a directory only if `id` closed it, a file always
// (its one name is gone or going). ARGV: P, ino, id
static REMOVE_INODE: LazyLock<Script> = LazyLock::new(|| {
    script(
        r#"
local ik = P..'i:'..ARGV[2]
local k = redis.call('HGET', ik, 'k')
if not k then return {} end
if k == 'd' and redis.call('HGET', ik, 'cl') ~= ARGV[3] then return {} end
return remove_inode(ARGV[2])
"#,
    )
});

// Drops dir/name -> ino while the intent is still there, then the intent.
// ARGV: P, dir, name, ino, intent, is_dir, now_ns
static DROP_ENTRY: LazyLock<Script> = LazyLock::new(|| {
    script(
        r#"
local dir, name, ino = ARGV[2], ARGV[3], ARGV[4]
local f = dir..'/'..name
if redis.call('HGET', P..'x', f) ~= ARGV[5] then return 0 end
if redis.call('HGET', P..'d:'..dir, name) == ino then
  redis.call('HDEL', P..'d:'..dir, name)
  if ARGV[6] == '1' then redis.call('HINCRBY', P..'i:'..dir, 'nl', -1) end
  touch(dir, ARGV[7])
end
redis.call('HDEL', P..'x', f)
return 1
"#,
    )
});

// The commit point of a rename across shards, in the target directory's
// shard: decided once (the verdict kept under `v:{id}`), then dp/dn names
// src, with a marker on the name until the rename is complete.
// ARGV: P, id, dp, dn, src, dst (0: none), src_is_dir, sp, now_ns, marker, dst_is_dir
static RENAME_COMMIT: LazyLock<Script> = LazyLock::new(|| {
    script(
        r#"
local id, dp, dn, src, dst = ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6]
local vk = P..'v:'..id
local v = redis.call('GET', vk)
if v then return v end
local f = dp..'/'..dn
local m = redis.call('HGET', P..'x', f)
if m == ARGV[10] then return 'ok' end
local pk = P..'i:'..dp
local dk = redis.call('HGET', pk, 'k')
local cur = redis.call('HGET', P..'d:'..dp, dn)
local r = 'ok'
if not dk then r = 'ENOENT'
elseif dk ~= 'd' then r = 'ENOTDIR'
elseif redis.call('HEXISTS', pk, 'cl') == 1 then r = 'ENOENT'
elseif m then r = 'EINTENT'
elseif (cur or '0') ~= dst then r = 'ECHANGED' end
if r == 'ok' then
  redis.call('HSET', P..'d:'..dp, dn, src)
  if ARGV[11] == '1' then redis.call('HINCRBY', pk, 'nl', -1) end
  if ARGV[7] == '1' and ARGV[8] ~= dp then redis.call('HINCRBY', pk, 'nl', 1) end
  touch(dp, ARGV[9])
  redis.call('HSET', P..'x', f, ARGV[10])
end
redis.call('SET', vk, r, 'PX', 3600000)
return r
"#,
    )
});

// After the commit, in the source directory's shard: sp/sn goes.
// ARGV: P, sp, sn, src, intent, src_is_dir, dp, now_ns
static RENAME_SOURCE: LazyLock<Script> = LazyLock::new(|| {
    script(
        r#"
local sp, sn, src = ARGV[2], ARGV[3], ARGV[4]
if redis.call('HGET', P..'x', sp..'/'..sn) ~= ARGV[5] then return 0 end
if redis.call('HGET', P..'d:'..sp, sn) == src then
  redis.call('HDEL', P..'d:'..sp, sn)
  if ARGV[6] == '1' and sp ~= ARGV[7] then redis.call('HINCRBY', P..'i:'..sp, 'nl', -1) end
  touch(sp, ARGV[8])
end
return 1
"#,
    )
});

// After the commit, in the moved inode's shard: its parent and name, once
// per rename. ARGV: P, src, sp, sn, dp, dn, id, now_ns, now_ms
static RENAME_INODE: LazyLock<Script> = LazyLock::new(|| {
    script(
        r#"
local ik = P..'i:'..ARGV[2]
local pn = redis.call('HMGET', ik, 'par', 'name', 'rid')
if not pn[1] or pn[3] == ARGV[7] then return 0 end
if pn[1] == ARGV[3] and pn[2] == ARGV[4] then
  redis.call('HSET', ik, 'par', ARGV[5], 'name', ARGV[6], 'ct', ARGV[8], 'rid', ARGV[7])
  redis.call('ZADD', P..'pub', ARGV[9], ARGV[2])
end
return 1
"#,
    )
});

// Sharded `mark_published`, step 1, in the global slot: the key is this
// inode's unless a delete of it is under way. ARGV: P, ino, xkey
static PUBLISH_KEY: LazyLock<Script> = LazyLock::new(|| {
    script(
        r#"
if redis.call('EXISTS', P..'del:'..ARGV[3]) == 1 then return 0 end
redis.call('HSET', P..'xk', ARGV[3], ARGV[2])
redis.call('SREM', P..'unpub', ARGV[3])
return 1
"#,
    )
});

// Sharded `mark_published`, step 2, in the inode's shard; a key it no
// longer uses is queued (`unpubq`) for the global map.
// ARGV: P, ino, gen, xkey, clear_import, now_ms
static PUBLISHED_AT: LazyLock<Script> = LazyLock::new(|| {
    script(
        r#"
local ino, gen, xkey = ARGV[2], ARGV[3], ARGV[4]
local ik = P..'i:'..ino
local cur = redis.call('HGET', ik, 'gen')
local old = redis.call('HGET', ik, 'xkey')
if cur ~= gen then
  if cur then redis.call('ZADD', P..'pub', ARGV[6], ino) end
  if old ~= xkey then redis.call('SADD', P..'unpubq', ino..'/'..xkey) end
  return 0
end
if old and old ~= '' and old ~= xkey then redis.call('SADD', P..'unpubq', ino..'/'..old) end
redis.call('HSET', ik, 'pgen', gen, 'xkey', xkey)
if ARGV[5] == '1' then redis.call('HDEL', ik, 'imp', 'implen') end
redis.call('ZREM', P..'pub', ino)
return 1
"#,
    )
});

// A queued export key applied to the global map: it is no longer `ino`'s.
// ARGV: P, ino, key
static UNPUBQ_APPLY: LazyLock<Script> = LazyLock::new(|| {
    script(
        r#"
if redis.call('HGET', P..'xk', ARGV[3]) == ARGV[2] then redis.call('HDEL', P..'xk', ARGV[3]) end
redis.call('SADD', P..'unpub', ARGV[3])
return 1
"#,
    )
});

// KEYS: the global meta hash; ARGV: chunk size, shards of a new file system.
static FORMAT_META: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        "if redis.call('HSETNX', KEYS[1], 'chunk_size', ARGV[1]) == 1 then redis.call('HSETNX', KEYS[1], 'shards', ARGV[2]) \
         else redis.call('HSETNX', KEYS[1], 'shards', 1) end return 1",
    )
});

// An import that found its name taken: the key it mapped first is not its. ARGV: P, ino, key
static UNPUBQ_APPLY_KEEP: LazyLock<Script> = LazyLock::new(|| {
    script("if redis.call('HGET', P..'xk', ARGV[3]) == ARGV[2] then redis.call('HDEL', P..'xk', ARGV[3]) end return 1")
});

// Frees the global directory-rename lock if still ours. KEYS: lock; ARGV: token
static UNLOCK: LazyLock<Script> = LazyLock::new(|| {
    Script::new("if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('DEL', KEYS[1]) end return 1")
});

/// How to log in to Redis: an ACL user and its password (`AUTH user pass`),
/// and for `rediss://` URLs the CA to check the server with (and a client
/// certificate, for servers that ask for one). The password never appears
/// in logs or errors (`Debug` hides it).
#[derive(Clone, Default)]
pub struct RedisAuth {
    pub user: Option<String>,
    pub password: Option<String>,
    /// `ca-cert.pem`, and optionally `client-cert.pem` + `client-key.pem`.
    pub tls_dir: Option<std::path::PathBuf>,
}

impl std::fmt::Debug for RedisAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisAuth")
            .field("user", &self.user)
            .field("password", &self.password.as_ref().map(|_| "***"))
            .field("tls_dir", &self.tls_dir)
            .finish()
    }
}

impl RedisAuth {
    /// The password in `path` (its first line).
    pub fn read_password(path: &std::path::Path) -> std::io::Result<String> {
        let text = std::fs::read_to_string(path).map_err(|e| std::io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
        Ok(text.lines().next().unwrap_or("").to_string())
    }
}

/// A Redis URL fit for logs: the password of `redis://user:password@host`
/// replaced by `***` (everything else kept, so the server is named).
pub fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else { return url.to_string() };
    let end = rest.find('/').unwrap_or(rest.len());
    match rest[..end].rfind('@') {
        Some(at) => {
            let user = rest[..at].split(':').next().unwrap_or("");
            let hidden = if rest[..at].contains(':') { format!("{user}:***") } else { "***".into() };
            format!("{scheme}://{hidden}{}", &rest[at..])
        }
        None => url.to_string(),
    }
}

/// A TLS directory is for `rediss://` URLs only (a plain URL would silently ignore it).
fn require_tls_url(info: &::redis::ConnectionInfo, shown: &str) -> MetaResult<()> {
    match info.addr {
        ::redis::ConnectionAddr::TcpTls { .. } => Ok(()),
        _ => Err(MetaError::Unavailable(format!("Redis TLS is configured but {shown} is not a rediss:// URL"))),
    }
}

fn tls_certificates(dir: &std::path::Path) -> std::io::Result<::redis::TlsCertificates> {
    let read = |f: &str| std::fs::read(dir.join(f)).map_err(|e| std::io::Error::new(e.kind(), format!("{}: {e}", dir.join(f).display())));
    let client_tls = match (dir.join("client-cert.pem").exists(), dir.join("client-key.pem").exists()) {
        (true, true) => Some(::redis::ClientTlsConfig { client_cert: read("client-cert.pem")?, client_key: read("client-key.pem")? }),
        (false, false) => None,
        _ => return Err(std::io::Error::new(std::io::ErrorKind::NotFound, format!("{}: client-cert.pem and client-key.pem go together", dir.display()))),
    };
    Ok(::redis::TlsCertificates { client_tls, root_cert: Some(read("ca-cert.pem")?) })
}

/// A single Redis, or a Redis Cluster.
enum Backend {
    Single(::redis::Client),
    Cluster(::redis::cluster::ClusterClient),
}

/// A connection to either backend. redis-rs's cluster connection refuses
/// `Pipeline::query` (it says it cannot pipeline); this wrapper keeps the
/// trait's default (it can), so a pipeline goes as one batch to the master
/// of its first command's key: right here, where every key of a file system
/// is in one slot, and a `MOVED` sends the whole batch on.
pub(crate) enum Conn {
    Single(Connection),
    Cluster(::redis::cluster::ClusterConnection),
}

impl ::redis::ConnectionLike for Conn {
    fn req_packed_command(&mut self, cmd: &[u8]) -> ::redis::RedisResult<Value> {
        match self {
            Conn::Single(c) => c.req_packed_command(cmd),
            Conn::Cluster(c) => c.req_packed_command(cmd),
        }
    }
    fn req_packed_commands(&mut self, cmd: &[u8], offset: usize, count: usize) -> ::redis::RedisResult<Vec<Value>> {
        match self {
            Conn::Single(c) => c.req_packed_commands(cmd, offset, count),
            Conn::Cluster(c) => c.req_packed_commands(cmd, offset, count),
        }
    }
    fn req_command(&mut self, cmd: &::redis::Cmd) -> ::redis::RedisResult<Value> {
        match self {
            Conn::Single(c) => c.req_command(cmd),
            Conn::Cluster(c) => c.req_command(cmd),
        }
    }
    fn get_db(&self) -> i64 {
        match self {
            Conn::Single(c) => c.get_db(),
            Conn::Cluster(c) => c.get_db(),
        }
    }
    fn check_connection(&mut self) -> bool {
        match self {
            Conn::Single(c) => c.check_connection(),
            Conn::Cluster(c) => c.check_connection(),
        }
    }
    fn is_open(&self) -> bool {
        match self {
            Conn::Single(c) => c.is_open(),
            Conn::Cluster(c) => c.is_open(),
        }
    }
}

/// The scheme naming a Redis Cluster: `redis+cluster://[user:pass@]host:port,host:port/`.
pub const CLUSTER_SCHEME: &str = "redis+cluster://";

/// The seed nodes of a cluster URL as plain `redis://` URLs (the login kept on each).
fn cluster_nodes(url: &str) -> Option<Vec<String>> {
    let rest = url.strip_prefix(CLUSTER_SCHEME)?;
    let hosts = rest.split('/').next().unwrap_or("");
    let (login, hosts) = match hosts.rfind('@') {
        Some(at) => (&hosts[..=at], &hosts[at + 1..]),
        None => ("", hosts),
    };
    Some(hosts.split(',').filter(|h| !h.is_empty()).map(|h| format!("redis://{login}{h}/")).collect())
}

/// Why the first seed of a cluster URL is of no use, as a plain connection
/// to it tells (None: it looks fine from here).
fn why_no_cluster(url: &str, auth: &RedisAuth) -> Option<String> {
    let seed = cluster_nodes(url)?.into_iter().next()?;
    let client = RedisMeta::single_client(&seed, &RedisAuth { tls_dir: None, ..auth.clone() }, &redact(&seed)).ok()?;
    let mut c = match client.get_connection_with_timeout(Duration::from_secs(2)) {
        Ok(c) => c,
        Err(e) if e.kind() == ::redis::ErrorKind::AuthenticationFailed => {
            return Some(format!("refused us: {e} (see --redis-user, --redis-password-file)"))
        }
        Err(e) => return Some(format!("{} unreachable: {e}", redact(&seed))),
    };
    match ::redis::cmd("CLUSTER").arg("INFO").query::<String>(&mut c) {
        Err(e) if e.to_string().contains("cluster support disabled") => {
            Some(format!("{} is not a cluster node (a single Redis takes a redis:// URL)", redact(&seed)))
        }
        Err(e) => Some(format!("refused us: {e} (see --redis-user, --redis-password-file)")),
        Ok(info) if !info.contains("cluster_state:ok") => {
            Some(format!("not ready: {}", info.lines().next().unwrap_or("").trim()))
        }
        Ok(_) => None,
    }
}

pub struct RedisMeta {
    client: Backend,
    /// The URL as logs show it (no password).
    url: String,
    fs: String,
    /// The global slot: parameters, counters, node leases, export keys.
    /// On an unsharded store every key is under it.
    prefix: String,
    /// The prefix of each shard (one: `prefix` itself), fixed at format.
    shards: parking_lot::RwLock<std::sync::Arc<Vec<String>>>,
    /// Shards a format makes (`with_shards`).
    want_shards: usize,
    pool: Mutex<Vec<Conn>>,
    retry_for: Duration,
    /// Inode numbers reserved for this client and not yet used, per shard.
    inos: Mutex<HashMap<usize, std::ops::Range<u64>>>,
    /// Steps of a cross-slot change left before an injected failure (tests:
    /// a process dying between steps); negative: none.
    crash_after: std::sync::atomic::AtomicI64,
}

/// An inode number's high bits name its shard: every key of an inode is
/// found from its number alone.
pub const SHARD_SHIFT: u32 = 40;
/// Shards a file system may have (inode numbers stay below 2^52, exact in
/// the doubles of Redis's Lua).
pub const MAX_SHARDS: usize = 4096;
/// Shards a file system formatted on Redis Cluster gets unless told
/// (`SURGE_BB_META_SHARDS`): enough to spread over 64 masters evenly.
pub const CLUSTER_SHARDS: usize = 64;

/// The prefixes of `k` shards of file system `fs`. One shard is the
/// unsharded layout (`bb:{fs}:` on a cluster, `bb:fs:` on one Redis). On a
/// cluster each shard's hash tag is picked so that shard `i` hashes into
/// the `i`-th of `k` equal slot ranges: masters that split the slots evenly
/// (as `redis-cli --cluster create` and `LocalCluster` do) then hold equal
/// numbers of shards.
fn shard_prefixes(fs: &str, cluster: bool, k: usize) -> Vec<String> {
    if k <= 1 {
        return vec![if cluster { format!("bb:{{{fs}}}:") } else { format!("bb:{fs}:") }];
    }
    (0..k)
        .map(|i| {
            if !cluster {
                return format!("bb:{fs}.s{i}:");
            }
            (0u64..)
                .map(|n| format!("bb:{{{fs}.s{i}.{n}}}:"))
                .find(|p| ::redis::cluster_routing::get_slot(p.as_bytes()) as usize * k / 16384 == i)
                .expect("some tag hashes into every range")
        })
        .collect()
}

pub fn shard_of(ino: Ino) -> usize {
    (ino >> SHARD_SHIFT) as usize
}

/// Inode numbers a client reserves at a time: one Redis write (and, with
/// `appendfsync always`, one fsync) per this many creates instead of one per
/// create. Numbers a client reserves and never uses are skipped, not reused.
const INO_BATCH: u64 = 64;

fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
}

fn map_err(e: RedisError) -> MetaError {
    let code = e.code().unwrap_or("").to_string();
    let text = e.to_string();
    let has = |c: &str| code == c || text.contains(c);
    if has("EINTENT") {
        MetaError::InFlight
    } else if has("ENOENT") {
        MetaError::NotFound
    } else if has("EEXIST") {
        MetaError::Exists
    } else if has("ENOTDIR") {
        MetaError::NotDir
    } else if has("EISDIR") {
        MetaError::IsDir
    } else if has("ENOTEMPTY") {
        MetaError::NotEmpty
    } else if has("EINVAL") {
        MetaError::Invalid
    } else if has("ECONFLICT") {
        let idx = text.split("ECONFLICT").nth(1).and_then(|s| s.split_whitespace().next()?.parse().ok());
        MetaError::Conflict(idx.unwrap_or(0))
    } else {
        MetaError::Corrupt(text)
    }
}

fn is_transient(e: &RedisError) -> bool {
    e.is_io_error() || e.is_connection_dropped() || e.is_connection_refusal() || e.is_timeout()
        || matches!(
            e.kind(),
            ::redis::ErrorKind::BusyLoadingError
                | ::redis::ErrorKind::TryAgain
                // A cluster whose master is restarting, or whose slots moved:
                // the cluster client's own few retries ran out, ours go on.
                | ::redis::ErrorKind::ClusterDown
                | ::redis::ErrorKind::MasterDown
                | ::redis::ErrorKind::Moved
                | ::redis::ErrorKind::Ask
                | ::redis::ErrorKind::ClusterConnectionNotFound
        )
        || e.to_string().contains("LOADING")
}

fn s(v: &Value) -> Option<String> {
    ::redis::from_redis_value::<String>(v).ok()
}

/// Decodes a flat `[idx, entry, idx, entry...]` reply (after `skip` leading items).
fn entries(v: Vec<String>, skip: usize) -> MetaResult<Vec<(u64, ChunkEntry)>> {
    v[skip.min(v.len())..]
        .chunks(2)
        .map(|p| {
            let idx = p[0].parse().map_err(|_| MetaError::Corrupt(format!("chunk index {:?}", p[0])))?;
            let e = p.get(1).and_then(|e| ChunkEntry::decode(e)).ok_or_else(|| MetaError::Corrupt(format!("{p:?}")))?;
            Ok((idx, e))
        })
        .collect()
}

impl RedisMeta {
    /// Connects to `url` (redis://host:port[/db]); `fs` names the file system
    /// so several can share one Redis.
    pub fn connect(url: &str, fs: &str) -> MetaResult<RedisMeta> {
        Self::connect_with(url, &RedisAuth::default(), fs)
    }

    /// [`RedisMeta::connect`], logging in as `auth` says (a user and password
    /// given there win over any in the URL).
    pub fn connect_with(url: &str, auth: &RedisAuth, fs: &str) -> MetaResult<RedisMeta> {
        let given = url;
        let shown = redact(url);
        let (client, prefix) = match cluster_nodes(url) {
            Some(nodes) => {
                // The name is the hash tag: with a brace in it (or none at
                // all) the keys of one file system would hash apart.
                if fs.is_empty() || fs.contains(['{', '}']) {
                    return Err(MetaError::Unavailable(format!("file-system name {fs:?}: on Redis Cluster it must be non-empty and without braces")));
                }
                (Backend::Cluster(Self::cluster_client(nodes, auth, &shown)?), format!("bb:{{{fs}}}:"))
            }
            None => (Backend::Single(Self::single_client(url, auth, &shown)?), format!("bb:{fs}:")),
        };
        let url = shown;
        let cluster = matches!(client, Backend::Cluster(_));
        let want_shards = match std::env::var("SURGE_BB_META_SHARDS") {
            Ok(v) => v.parse().ok().filter(|&k| (1..=MAX_SHARDS).contains(&k))
                .ok_or_else(|| MetaError::Unavailable(format!("SURGE_BB_META_SHARDS={v}: want a number of shards from 1 to {MAX_SHARDS}")))?,
            Err(_) if cluster => CLUSTER_SHARDS,
            Err(_) => 1,
        };
        let m = RedisMeta {
            client,
            url: url.clone(),
            fs: fs.to_string(),
            shards: parking_lot::RwLock::new(std::sync::Arc::new(vec![prefix.clone()])),
            prefix,
            want_shards,
            pool: Mutex::default(),
            retry_for: Duration::from_secs(20),
            inos: Mutex::default(),
            crash_after: std::sync::atomic::AtomicI64::new(-1),
        };
        // Fail fast with a clear message when Redis is not there at all.
        let mut c = m.open_conn().map_err(|e| match m.client {
            // The cluster client only says it could not use any seed: ask
            // the first one directly why (a login refused, no cluster there).
            Backend::Cluster(_) => MetaError::Unavailable(format!("Redis Cluster at {url}: {}", why_no_cluster(given, auth).unwrap_or(e.to_string()))),
            Backend::Single(_) => MetaError::Unavailable(format!("Redis at {url} unreachable: {e}")),
        })?;
        // A server that wants a login (or another one) says so now, not at the first file.
        ::redis::cmd("PING").query::<String>(&mut c).map_err(|e| match (&m.client, why_no_cluster(given, auth)) {
            // (A plain Redis behind a cluster URL gets as far as here.)
            (Backend::Cluster(_), Some(why)) => MetaError::Unavailable(format!("Redis Cluster at {url}: {why}")),
            _ => MetaError::Unavailable(format!("Redis at {url} refused us: {e} (see --redis-user, --redis-password-file)")),
        })?;
        m.pool.lock().push(c);
        m.load_shards()?;
        Ok(m)
    }

    /// Shards a format of a new file system makes (an existing one keeps its own).
    pub fn with_shards(mut self, k: usize) -> Self {
        self.want_shards = k.clamp(1, MAX_SHARDS);
        self
    }

    /// The shards this file system has (1: unsharded).
    pub fn shard_count(&self) -> usize {
        self.shards.read().len()
    }

    /// The key prefix of each shard.
    pub fn shard_prefixes(&self) -> Vec<String> {
        self.shards.read().to_vec()
    }

    /// Makes the next cross-slot change fail after `steps` of its steps, as
    /// if its process died there (tests of recovery).
    #[doc(hidden)]
    pub fn inject_crash_after(&self, steps: i64) {
        self.crash_after.store(steps, std::sync::atomic::Ordering::SeqCst);
    }

    /// The shard count a format recorded (none yet: unsharded until formatted).
    fn load_shards(&self) -> MetaResult<()> {
        let k: Option<usize> = self.with(|c| ::redis::cmd("HGET").arg(self.k("meta")).arg("shards").query(c))?;
        let k = k.unwrap_or(1);
        if k > MAX_SHARDS {
            return Err(MetaError::Corrupt(format!("file system {} says it has {k} shards", self.prefix)));
        }
        if k != self.shard_count() {
            *self.shards.write() = std::sync::Arc::new(shard_prefixes(&self.fs, matches!(self.client, Backend::Cluster(_)), k));
        }
        Ok(())
    }

    /// How long calls keep retrying a lost Redis before failing.
    pub fn with_retry_for(mut self, d: Duration) -> Self {
        self.retry_for = d;
        self
    }

    fn single_client(url: &str, auth: &RedisAuth, shown: &str) -> MetaResult<::redis::Client> {
        use ::redis::IntoConnectionInfo as _;
        let bad = |e: String| MetaError::Unavailable(format!("bad Redis URL {shown}: {e}"));
        let mut info = url.into_connection_info().map_err(|e| bad(e.to_string()))?;
        if auth.user.is_some() {
            info.redis.username = auth.user.clone();
        }
        if auth.password.is_some() {
            info.redis.password = auth.password.clone();
        }
        match &auth.tls_dir {
            Some(dir) => {
                require_tls_url(&info, shown)?;
                let certs = tls_certificates(dir).map_err(|e| MetaError::Unavailable(format!("Redis TLS: {e}")))?;
                ::redis::Client::build_with_tls(info, certs)
            }
            None => ::redis::Client::open(info),
        }
        .map_err(|e| bad(e.to_string()))
    }

    fn cluster_client(nodes: Vec<String>, auth: &RedisAuth, shown: &str) -> MetaResult<::redis::cluster::ClusterClient> {
        if nodes.is_empty() {
            return Err(MetaError::Unavailable(format!("bad Redis URL {shown}: no host:port in it")));
        }
        let db = shown.strip_prefix(CLUSTER_SCHEME).and_then(|r| r.split_once('/')).map_or("", |(_, db)| db);
        if !db.is_empty() && db != "0" {
            return Err(MetaError::Unavailable(format!("bad Redis URL {shown}: a Redis Cluster has database 0 only")));
        }
        if auth.tls_dir.is_some() {
            return Err(MetaError::Unavailable(format!("Redis TLS is not supported on Redis Cluster ({shown})")));
        }
        // The client's own retries (redirects, CLUSTERDOWN) stay few and
        // short: its default backoff (16 tries from 1.28 s up) could hold a
        // call for minutes, past `retry_for`, which `with` enforces.
        let mut b = ::redis::cluster::ClusterClientBuilder::new(nodes)
            .connection_timeout(Duration::from_secs(2))
            .retries(3)
            .min_retry_wait(20)
            .max_retry_wait(200);
        if let Some(u) = &auth.user {
            b = b.username(u.clone());
        }
        if let Some(p) = &auth.password {
            b = b.password(p.clone());
        }
        b.build().map_err(|e| MetaError::Unavailable(format!("bad Redis URL {shown}: {e}")))
    }

    fn open_conn(&self) -> Result<Conn, RedisError> {
        match &self.client {
            Backend::Single(client) => {
                let c = client.get_connection_with_timeout(Duration::from_secs(2))?;
                c.set_read_timeout(Some(Duration::from_secs(10)))?;
                c.set_write_timeout(Some(Duration::from_secs(10)))?;
                Ok(Conn::Single(c))
            }
            Backend::Cluster(client) => {
                let c = client.get_connection()?;
                c.set_read_timeout(Some(Duration::from_secs(10)))?;
                c.set_write_timeout(Some(Duration::from_secs(10)))?;
                Ok(Conn::Cluster(c))
            }
        }
    }

    /// Runs `f` on a pooled connection, reconnecting and retrying while Redis is
    /// unreachable, up to `retry_for`.
    fn with<T>(&self, mut f: impl FnMut(&mut Conn) -> Result<T, RedisError>) -> MetaResult<T> {
        let start = Instant::now();
        let mut logged = false;
        loop {
            let conn = self.pool.lock().pop();
            let mut conn = match conn {
                Some(c) => c,
                None => match self.open_conn() {
                    Ok(c) => c,
                    Err(e) => {
                        if start.elapsed() >= self.retry_for {
                            tracing::error!("Redis at {} unreachable for {:?}: {e}", self.url, self.retry_for);
                            return Err(MetaError::Unavailable(format!("Redis at {} unreachable: {e}", self.url)));
                        }
                        if !logged {
                            tracing::warn!("Redis at {} unreachable ({e}); retrying", self.url);
                            logged = true;
                        }
                        std::thread::sleep(Duration::from_millis(100));
                        continue;
                    }
                },
            };
            match f(&mut conn) {
                Ok(v) => {
                    self.pool.lock().push(conn);
                    return Ok(v);
                }
                Err(e) if is_transient(&e) => {
                    if start.elapsed() >= self.retry_for {
                        tracing::error!("Redis at {} failed: {e}", self.url);
                        return Err(MetaError::Unavailable(format!("Redis at {}: {e}", self.url)));
                    }
                    std::thread::sleep(Duration::from_millis(50));
                }
                Err(e) => {
                    self.pool.lock().push(conn);
                    return Err(map_err(e));
                }
            }
        }
    }

    fn k(&self, rest: &str) -> String {
        format!("{}{rest}", self.prefix)
    }

    /// The prefix of shard `k` (NotFound past the last: a number no inode has).
    fn sp(&self, k: usize) -> MetaResult<String> {
        self.shards.read().get(k).cloned().ok_or(MetaError::NotFound)
    }

    /// Key `rest` in the shard of inode `ino`.
    fn ki(&self, ino: Ino, rest: &str) -> MetaResult<String> {
        Ok(format!("{}{rest}", self.sp(shard_of(ino))?))
    }

    /// Runs a script in the global slot.
    fn run<T: ::redis::FromRedisValue>(&self, sc: &Script, args: &[String]) -> MetaResult<T> {
        self.run_at(&self.prefix, sc, args)
    }

    /// Runs a script in shard `k`.
    fn run_in<T: ::redis::FromRedisValue>(&self, k: usize, sc: &Script, args: &[String]) -> MetaResult<T> {
        let p = self.sp(k)?;
        self.run_at(&p, sc, args)
    }

    fn run_at<T: ::redis::FromRedisValue>(&self, prefix: &str, sc: &Script, args: &[String]) -> MetaResult<T> {
        self.with(|c| {
            let mut inv = sc.prepare_invoke();
            // The scripts name their keys from the prefix in ARGV; this key
            // (in the prefix's slot) routes them to the master holding it.
            inv.key(format!("{prefix}meta"));
            inv.arg(prefix);
            for a in args {
                inv.arg(a);
            }
            inv.invoke::<T>(c)
        })
    }

    fn parse_attr(&self, ino: Ino, h: &HashMap<String, String>) -> MetaResult<Attr> {
        if h.is_empty() {
            return Err(MetaError::NotFound);
        }
        let num = |f: &str| -> i64 { h.get(f).and_then(|v| v.parse().ok()).unwrap_or(0) };
        let kind = match h.get("k").map(String::as_str) {
            Some("d") => Kind::Dir,
            Some("f") => Kind::File,
            other => return Err(MetaError::Corrupt(format!("inode {ino} has kind {other:?}"))),
        };
        Ok(Attr {
            ino,
            kind,
            mode: num("mode") as u32,
            uid: num("uid") as u32,
            gid: num("gid") as u32,
            size: num("size") as u64,
            mtime_ns: num("mt"),
            ctime_ns: num("ct"),
            atime_ns: num("at"),
            nlink: num("nl") as u32,
            gen: num("gen") as u64,
            pgen: num("pgen") as u64,
            parent: num("par") as u64,
            name: h.get("name").cloned().unwrap_or_default(),
            import: h.get("imp").map(|k| (k.clone(), num("implen") as u64)),
            xkey: h.get("xkey").filter(|x| !x.is_empty()).cloned(),
        })
    }

    #[cfg(test)]
    fn alloc_ino(&self) -> MetaResult<Ino> {
        self.alloc_ino_in(0)
    }

    /// A new inode number of shard `k` (its counter is in that shard: a
    /// create touches no global key).
    fn alloc_ino_in(&self, k: usize) -> MetaResult<Ino> {
        let mut inos = self.inos.lock();
        let r = inos.entry(k).or_insert(0..0);
        if r.is_empty() {
            let key = format!("{}meta", self.sp(k)?);
            let last: u64 = self.with(|c| ::redis::cmd("HINCRBY").arg(&key).arg("next_ino").arg(INO_BATCH).query(c))?;
            if last >= 1 << SHARD_SHIFT {
                return Err(MetaError::Unavailable(format!("shard {k} of {} has used all its inode numbers", self.prefix)));
            }
            *r = last + 1 - INO_BATCH..last + 1;
        }
        Ok(((k as u64) << SHARD_SHIFT) | r.next().expect("a reserved range is not empty"))
    }

    /// One command per shard, in one round trip per master; the replies in shard order.
    fn fan<T: ::redis::FromRedisValue>(&self, cmd: impl Fn(&str) -> ::redis::Cmd) -> MetaResult<Vec<T>> {
        let shards = self.shards.read().clone();
        self.pipe_any(&shards.iter().map(|p| cmd(p)).collect::<Vec<_>>())
    }

    /// Commands on keys of any slots, each sent to its master.
    fn pipe_any<T: ::redis::FromRedisValue>(&self, cmds: &[::redis::Cmd]) -> MetaResult<Vec<T>> {
        if cmds.is_empty() {
            return Ok(vec![]);
        }
        self.with(|c| match c {
            Conn::Single(c) => {
                let mut p = ::redis::pipe();
                for cmd in cmds {
                    p.add_command(cmd.clone());
                }
                p.query(c)
            }
            Conn::Cluster(c) => {
                let mut p = ::redis::cluster::cluster_pipe();
                for cmd in cmds {
                    p.add_command(cmd.clone());
                }
                p.query(c)
            }
        })
    }

    /// Where a directory created as `name` in `parent` lives: by hash of
    /// (parent, name), as the paper's masters place paths.
    fn dir_shard(&self, parent: Ino, name: &str) -> usize {
        let k = self.shard_count();
        if k == 1 {
            return 0;
        }
        ::redis::cluster_routing::get_slot(format!("{parent}/{name}").as_bytes()) as usize % k
    }
}

fn now_ms_s() -> String {
    now_ms().to_string()
}

impl MetaStore for RedisMeta {
    fn format(&self, params: &FsParams) -> MetaResult<FsParams> {
        let meta = self.k("meta");
        // A new file system gets the shards asked for; one formatted before
        // shards existed keeps its single one.
        self.with(|c| FORMAT_META.key(&meta).arg(params.chunk_size).arg(self.want_shards).invoke::<i64>(c))?;
        self.load_shards()?;
        let shards = self.shard_prefixes();
        let sharded = shards.len() > 1;
        let root = format!("{}i:{ROOT}", shards[0]);
        self.with(|c| {
            for (i, p) in shards.iter().enumerate() {
                // Inode numbers of shard 0 start after the root's.
                ::redis::cmd("HSETNX").arg(format!("{p}meta")).arg("next_ino").arg(if i == 0 { ROOT } else { 0 }).query::<()>(c)?;
                if sharded {
                    ::redis::cmd("HSET").arg(format!("{p}meta")).arg("sharded").arg(1).query::<()>(c)?;
                }
            }
            let now = crate::now_ns();
            if !::redis::cmd("EXISTS").arg(&root).query::<bool>(c)? {
                ::redis::cmd("HSET")
                    .arg(&root)
                    .arg(&["k", "d", "mode", "493", "uid", "0", "gid", "0", "size", "0", "nl", "2", "gen", "0", "pgen", "0", "par", "0", "name", ""])
                    .arg(&["mt", &now.to_string(), "ct", &now.to_string(), "at", &now.to_string()])
                    .query::<()>(c)?;
            }
            Ok(())
        })?;
        self.params()
    }

    fn params(&self) -> MetaResult<FsParams> {
        let cs: Option<u64> = self.with(|c| ::redis::cmd("HGET").arg(self.k("meta")).arg("chunk_size").query(c))?;
        match cs {
            Some(chunk_size) if chunk_size > 0 => Ok(FsParams { chunk_size }),
            _ => Err(MetaError::Corrupt(format!("file system {} is not formatted (no chunk size)", self.prefix))),
        }
    }

    fn new_client_id(&self) -> MetaResult<u64> {
        self.with(|c| ::redis::cmd("HINCRBY").arg(self.k("meta")).arg("clients").arg(1).query::<u64>(c))
    }

    fn lookup(&self, parent: Ino, name: &str) -> MetaResult<Attr> {
        let (ino, h): (u64, HashMap<String, String>) =
            self.settling(&[(parent, name)], || self.run_in(shard_of(parent), &LOOKUP, &[parent.to_string(), name.into()]))?;
        if shard_of(ino) != shard_of(parent) {
            return self.getattr(ino);
        }
        self.parse_attr(ino, &h)
    }

    fn getattr(&self, ino: Ino) -> MetaResult<Attr> {
        let key = self.ki(ino, &format!("i:{ino}"))?;
        let h: HashMap<String, String> = self.with(|c| ::redis::cmd("HGETALL").arg(&key).query(c))?;
        self.parse_attr(ino, &h)
    }

    fn getattr_with_ancestors(&self, ino: Ino) -> MetaResult<(Attr, Vec<Placement>)> {
        if self.shard_count() > 1 {
            // The directories above are in other shards: one read each.
            return ancestors_one_by_one(self, ino);
        }
        let v: Vec<Value> = self.run(&GETATTR_WITH_ANCESTORS, &[ino.to_string(), MAX_DEPTH.to_string()])?;
        let mut it = v.into_iter();
        let h: HashMap<String, String> = match it.next() {
            Some(h) => ::redis::from_redis_value(&h).map_err(|e| MetaError::Corrupt(format!("inode {ino}: {e}")))?,
            None => return Err(MetaError::NotFound),
        };
        let a = self.parse_attr(ino, &h)?;
        let rest: Vec<String> = it
            .map(|x| ::redis::from_redis_value(&x))
            .collect::<Result<_, _>>()
            .map_err(|e| MetaError::Corrupt(format!("ancestors of inode {ino}: {e}")))?;
        let num = |s: &str| s.parse::<Ino>().map_err(|_| MetaError::Corrupt(format!("ancestors of inode {ino}: {s:?}")));
        let up = rest
            .chunks_exact(3)
            .map(|t| Ok(Placement { ino: num(&t[0])?, parent: num(&t[1])?, name: t[2].clone() }))
            .collect::<MetaResult<_>>()?;
        Ok((a, up))
    }

    fn setattr(&self, ino: Ino, set: &SetAttr, now_ns: i64) -> MetaResult<Attr> {
        let mut fields: Vec<String> = vec!["ct".into(), now_ns.to_string()];
        let mut add = |k: &str, v: Option<String>| {
            if let Some(v) = v {
                fields.push(k.into());
                fields.push(v);
            }
        };
        add("mode", set.mode.map(|m| m.to_string()));
        add("uid", set.uid.map(|m| m.to_string()));
        add("gid", set.gid.map(|m| m.to_string()));
        add("at", set.atime_ns.map(|m| m.to_string()));
        add("mt", set.mtime_ns.map(|m| m.to_string()));
        let key = self.ki(ino, &format!("i:{ino}"))?;
        // Only an existing inode: HSET on a vanished one would resurrect it.
        let h: HashMap<String, String> = self.with(|c| SETATTR.key(&key).arg(&fields).invoke(c))?;
        self.parse_attr(ino, &h)
    }

    fn create(&self, parent: Ino, name: &str, kind: Kind, mode: u32, uid: u32, gid: u32, now_ns: i64) -> MetaResult<Attr> {
        if name.is_empty() || name.contains('/') || name == "." || name == ".." {
            return Err(MetaError::Invalid);
        }
        // A file lives in its directory's shard; a directory where its
        // (parent, name) hashes.
        let home = if kind == Kind::Dir { self.dir_shard(parent, name) } else { shard_of(parent) };
        let ino = self.alloc_ino_in(home)?;
        if home != shard_of(parent) {
            return self.mkdir_across(parent, name, ino, mode, uid, gid, now_ns);
        }
        let h: HashMap<String, String> = self.settling(&[(parent, name)], || {
            self.run_in(
                home,
                &CREATE,
                &[parent.to_string(), name.into(), ino.to_string(), kind.code().into(), mode.to_string(), uid.to_string(),
                  gid.to_string(), now_ns.to_string(), now_ms_s()],
            )
        })?;
        self.parse_attr(ino, &h)
    }

    fn unlink(&self, parent: Ino, name: &str, now_ns: i64) -> MetaResult<Removed> {
        let v: Vec<String> = self.settling(&[(parent, name)], || {
            self.run_in(shard_of(parent), &UNLINK, &[parent.to_string(), name.into(), now_ns.to_string(), "0".into()])
        })?;
        if v.first().map(String::as_str) == Some("XS") {
            let ino = v.get(1).and_then(|i| i.parse().ok()).ok_or_else(|| MetaError::Corrupt("unlink reply".into()))?;
            return self.remove_across(parent, name, ino, Kind::File, now_ns);
        }
        let ino = v.first().and_then(|i| i.parse().ok()).ok_or_else(|| MetaError::Corrupt("unlink reply".into()))?;
        Ok(Removed { ino, chunks: entries(v, 1)? })
    }

    fn rmdir(&self, parent: Ino, name: &str, now_ns: i64) -> MetaResult<()> {
        let v: Vec<String> = self.settling(&[(parent, name)], || {
            self.run_in(shard_of(parent), &UNLINK, &[parent.to_string(), name.into(), now_ns.to_string(), "1".into()])
        })?;
        if v.first().map(String::as_str) == Some("XS") {
            let ino = v.get(1).and_then(|i| i.parse().ok()).ok_or_else(|| MetaError::Corrupt("rmdir reply".into()))?;
            self.remove_across(parent, name, ino, Kind::Dir, now_ns)?;
        }
        Ok(())
    }

    fn rename(&self, parent: Ino, name: &str, new_parent: Ino, new_name: &str, now_ns: i64) -> MetaResult<Option<Removed>> {
        if new_name.is_empty() || new_name.contains('/') || new_name == "." || new_name == ".." {
            return Err(MetaError::Invalid);
        }
        if self.shard_count() == 1 {
            return self.rename_here(parent, name, new_parent, new_name, now_ns);
        }
        let src = self.lookup(parent, name)?;
        // A directory moving to another parent: under the global rename lock
        // (as a local file system's rename mutex), so the check that it does
        // not move under itself holds until it has moved.
        let _lock = if src.kind == Kind::Dir && parent != new_parent { Some(self.rename_lock()?) } else { None };
        if src.kind == Kind::Dir && parent != new_parent {
            let mut a = new_parent;
            for _ in 0..MAX_DEPTH {
                if a == src.ino {
                    return Err(MetaError::Invalid);
                }
                if a == ROOT || a == 0 {
                    break;
                }
                a = self.getattr(a)?.parent;
            }
        }
        if shard_of(parent) == shard_of(new_parent) {
            match self.rename_here(parent, name, new_parent, new_name, now_ns) {
                Err(MetaError::Corrupt(e)) if e == "XS" => {}
                r => return r,
            }
        }
        self.rename_across(parent, name, new_parent, new_name, now_ns)
    }

    fn readdir(&self, ino: Ino) -> MetaResult<Vec<DirEntry>> {
        let a = self.getattr(ino)?;
        if a.kind != Kind::Dir {
            return Err(MetaError::NotDir);
        }
        let key = self.ki(ino, &format!("d:{ino}"))?;
        let names: Vec<(String, u64)> = self.with(|c| ::redis::cmd("HGETALL").arg(&key).query(c))?;
        // Kinds in one pipelined round trip (per master: children of other shards).
        let cmds = names
            .iter()
            .map(|(_, child)| Ok(::redis::cmd("HGET").arg(self.ki(*child, &format!("i:{child}"))?).arg("k").clone()))
            .collect::<MetaResult<Vec<_>>>()?;
        let kinds: Vec<Option<String>> = self.pipe_any(&cmds)?;
        let mut out: Vec<DirEntry> = names
            .into_iter()
            .zip(kinds)
            .filter_map(|((name, ino), k)| {
                // (An entry whose inode is not there yet, or no longer: a
                // change across shards under way.)
                let kind = match k?.as_str() {
                    "d" => Kind::Dir,
                    _ => Kind::File,
                };
                Some(DirEntry { name, ino, kind })
            })
            .collect();
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    fn recover(&self) -> MetaResult<usize> {
        let all: Vec<Vec<String>> = self.fan(|p| ::redis::cmd("HKEYS").arg(format!("{p}x")).clone())?;
        let mut n = 0;
        for (k, fields) in all.into_iter().enumerate() {
            for f in fields {
                n += 1;
                match self.settle_field(k, &f) {
                    Ok(()) | Err(MetaError::NotFound | MetaError::NotEmpty | MetaError::NotDir | MetaError::IsDir | MetaError::Exists) => {}
                    Err(e) => return Err(e),
                }
            }
        }
        Ok(n)
    }

    fn chunks(&self, ino: Ino, idxs: &[u64]) -> MetaResult<(FileView, Vec<Option<ChunkEntry>>)> {
        let (ik, ck) = (self.ki(ino, &format!("i:{ino}"))?, self.ki(ino, &format!("c:{ino}"))?);
        let (head, raw): (Vec<Option<String>>, Vec<Option<String>>) = self.with(|c| {
            let mut p = ::redis::pipe();
            p.cmd("HMGET").arg(&ik).arg(&["size", "imp", "implen"]);
            if idxs.is_empty() {
                p.cmd("HMGET").arg(&ck).arg("-1");
            } else {
                p.cmd("HMGET").arg(&ck).arg(idxs);
            }
            p.query(c)
        })?;
        let size = head.first().cloned().flatten().and_then(|s| s.parse().ok()).ok_or(MetaError::NotFound)?;
        let import = match (head.get(1).cloned().flatten(), head.get(2).cloned().flatten()) {
            (Some(k), Some(l)) => Some((k, l.parse().unwrap_or(0))),
            _ => None,
        };
        let e = raw.into_iter().take(idxs.len()).map(|r| r.and_then(|s| ChunkEntry::decode(&s))).collect();
        Ok((FileView { size, import }, e))
    }

    fn chunk_map(&self, ino: Ino) -> MetaResult<BTreeMap<u64, ChunkEntry>> {
        let key = self.ki(ino, &format!("c:{ino}"))?;
        let v: Vec<String> = self.with(|c| ::redis::cmd("HGETALL").arg(&key).query(c))?;
        Ok(entries(v, 0)?.into_iter().collect())
    }

    fn commit(&self, ino: Ino, end: u64, updates: &[ChunkUpdate], now_ns: i64) -> MetaResult<Vec<(u64, ChunkEntry)>> {
        self.commit_inner(ino, end, updates, now_ns, true)
    }

    fn materialize(&self, ino: Ino, update: &ChunkUpdate) -> MetaResult<()> {
        self.commit_inner(ino, 0, std::slice::from_ref(update), 0, false).map(|_| ())
    }

    fn truncate(&self, ino: Ino, size: u64, tail: Option<&ChunkUpdate>, now_ns: i64) -> MetaResult<Vec<(u64, ChunkEntry)>> {
        let params = self.params()?;
        let (ti, tb, te) = match tail {
            Some(u) => (u.idx.to_string(), u.base.unwrap_or(0).to_string(), u.entry.encode()),
            None => (String::new(), String::new(), String::new()),
        };
        let v: Vec<String> = self.run_in(
            shard_of(ino),
            &TRUNCATE,
            &[ino.to_string(), size.to_string(), now_ns.to_string(), now_ms_s(), params.chunk_size.to_string(), ti, tb, te],
        )?;
        entries(v, 0)
    }

    fn dirty_oldest(&self, n: usize) -> MetaResult<Vec<(ChunkId, i64)>> {
        // Each shard's oldest n, merged.
        let per: Vec<Vec<(String, f64)>> =
            self.fan(|p| ::redis::cmd("ZRANGE").arg(format!("{p}dirty")).arg(0).arg(n as i64 - 1).arg("WITHSCORES").clone())?;
        let mut v: Vec<(ChunkId, i64)> =
            per.into_iter().flatten().filter_map(|(m, s)| Some((ChunkId::parse_member(&m)?, s as i64))).collect();
        v.sort_by_key(|(_, at)| *at);
        v.truncate(n);
        Ok(v)
    }

    fn dirty_count(&self) -> MetaResult<u64> {
        let per: Vec<u64> = self.fan(|p| ::redis::cmd("ZCARD").arg(format!("{p}dirty")).clone())?;
        Ok(per.into_iter().sum())
    }

    fn is_dirty(&self, chunk: &ChunkId) -> MetaResult<bool> {
        let key = self.ki(chunk.ino, "dirty")?;
        let s: Option<f64> = self.with(|c| ::redis::cmd("ZSCORE").arg(&key).arg(chunk.member()).query(c))?;
        Ok(s.is_some())
    }

    fn expedite(&self, ino: Ino) -> MetaResult<()> {
        let map = self.chunk_map(ino)?;
        let members: Vec<String> = map
            .iter()
            .filter(|(_, e)| !e.persisted)
            .map(|(idx, e)| ChunkId { ino, idx: *idx, ver: e.ver }.member())
            .collect();
        if members.is_empty() {
            return Ok(());
        }
        let key = self.ki(ino, "dirty")?;
        // XX: only entries still in the log (a persisted one must not come back).
        self.with(|c| {
            let mut p = ::redis::pipe();
            for m in &members {
                p.cmd("ZADD").arg(&key).arg("XX").arg(0).arg(m).ignore();
            }
            p.query::<()>(c)
        })
    }

    fn mark_persisted(&self, chunk: &ChunkId) -> MetaResult<bool> {
        let r: i64 = self.run_in(shard_of(chunk.ino), &MARK_PERSISTED, &[chunk.ino.to_string(), chunk.idx.to_string(), chunk.ver.to_string()])?;
        Ok(r == 1)
    }

    fn set_holders(&self, chunk: &ChunkId, old: &[String], new: &[String]) -> MetaResult<bool> {
        let r: i64 = self.run_in(
            shard_of(chunk.ino),
            &SET_HOLDERS,
            &[chunk.ino.to_string(), chunk.idx.to_string(), chunk.ver.to_string(), old.join(","), new.join(",")],
        )?;
        Ok(r == 1)
    }

    fn drop_holder(&self, chunk: &ChunkId, addr: &str) -> MetaResult<bool> {
        let r: i64 = self.run_in(shard_of(chunk.ino), &DROP_HOLDER, &[chunk.ino.to_string(), chunk.idx.to_string(), chunk.ver.to_string(), addr.into()])?;
        Ok(r == 1)
    }

    fn publish_queue(&self, before_ms: i64, n: usize) -> MetaResult<Vec<Ino>> {
        let per: Vec<Vec<(Ino, f64)>> = self.fan(|p| {
            ::redis::cmd("ZRANGEBYSCORE").arg(format!("{p}pub")).arg("-inf").arg(before_ms).arg("WITHSCORES").arg("LIMIT").arg(0).arg(n).clone()
        })?;
        let mut v: Vec<(Ino, f64)> = per.into_iter().flatten().collect();
        v.sort_by(|a, b| a.1.total_cmp(&b.1));
        Ok(v.into_iter().take(n).map(|(ino, _)| ino).collect())
    }

    fn requeue_publish(&self, ino: Ino, at_ms: i64) -> MetaResult<()> {
        let key = self.ki(ino, "pub")?;
        self.with(|c| ::redis::cmd("ZADD").arg(&key).arg(at_ms).arg(ino).query::<()>(c))
    }

    fn drop_publish(&self, ino: Ino) -> MetaResult<()> {
        let key = self.ki(ino, "pub")?;
        self.with(|c| ::redis::cmd("ZREM").arg(&key).arg(ino).query::<()>(c))
    }

    fn mark_published(&self, ino: Ino, gen: u64, xkey: &str, clear_import: bool) -> MetaResult<bool> {
        let clear = if clear_import { "1" } else { "0" };
        if self.shard_count() == 1 {
            let r: i64 = self.run(&MARK_PUBLISHED, &[ino.to_string(), gen.to_string(), xkey.into(), clear.into(), now_ms_s()])?;
            return Ok(r == 1);
        }
        // The global export-key map first (a crash after leaves the key
        // mapped to this inode: the object is kept, never lost), then the inode.
        let ok: i64 = self.run(&PUBLISH_KEY, &[ino.to_string(), xkey.into()])?;
        if ok == 0 {
            self.requeue_publish(ino, now_ms())?;
            return Ok(false);
        }
        let r: i64 = self.run_in(shard_of(ino), &PUBLISHED_AT, &[ino.to_string(), gen.to_string(), xkey.into(), clear.into(), now_ms_s()])?;
        Ok(r == 1)
    }

    fn publish_pending(&self) -> MetaResult<u64> {
        let per: Vec<u64> = self.fan(|p| ::redis::cmd("ZCARD").arg(format!("{p}pub")).clone())?;
        Ok(per.into_iter().sum())
    }

    fn claim_unpublish(&self) -> MetaResult<Option<String>> {
        let v: Value = self.run(&CLAIM_UNPUB, &[])?;
        if s(&v).is_none() && self.shard_count() > 1 {
            // None left in the global set: bring in what the shards queued.
            self.apply_unpublish_queues()?;
            let v: Value = self.run(&CLAIM_UNPUB, &[])?;
            return Ok(s(&v));
        }
        Ok(s(&v))
    }

    fn unpublish_done(&self, key: &str) -> MetaResult<()> {
        self.with(|c| ::redis::cmd("DEL").arg(self.k(&format!("del:{key}"))).query::<()>(c))
    }

    fn import_file(&self, parent: Ino, name: &str, key: &str, size: u64, now_ns: i64) -> MetaResult<Attr> {
        let ino = self.alloc_ino_in(shard_of(parent))?;
        let sharded = self.shard_count() > 1;
        if sharded {
            // The global map first: a crash after it keeps the object, never deletes it.
            self.with(|c| ::redis::cmd("HSET").arg(self.k("xk")).arg(key).arg(ino).query::<()>(c))?;
        }
        let got: u64 = self.settling(&[(parent, name)], || {
            self.run_in(
                shard_of(parent),
                &IMPORT,
                &[parent.to_string(), name.into(), ino.to_string(), key.into(), size.to_string(), now_ns.to_string()],
            )
        })?;
        if sharded && got != ino {
            let _: i64 = self.run(&UNPUBQ_APPLY_KEEP, &[ino.to_string(), key.into()])?;
        }
        self.getattr(got)
    }

    fn register_node(&self, node: &NodeInfo, ttl_ms: u64) -> MetaResult<()> {
        let info = serde_json::to_string(node).map_err(|e| MetaError::Corrupt(e.to_string()))?;
        let exp = now_ms() + ttl_ms as i64;
        self.with(|c| {
            ::redis::pipe()
                .cmd("ZADD").arg(self.k("nodes")).arg(exp).arg(&node.addr).ignore()
                .cmd("HSET").arg(self.k("nodeinfo")).arg(&node.addr).arg(&info).ignore()
                .query::<()>(c)
        })
    }

    fn live_nodes(&self) -> MetaResult<Vec<NodeInfo>> {
        let now = now_ms();
        let addrs: Vec<String> =
            self.with(|c| ::redis::cmd("ZRANGEBYSCORE").arg(self.k("nodes")).arg(now).arg("+inf").query(c))?;
        if addrs.is_empty() {
            return Ok(vec![]);
        }
        let infos: Vec<Option<String>> = self.with(|c| ::redis::cmd("HMGET").arg(self.k("nodeinfo")).arg(&addrs).query(c))?;
        let mut out: Vec<NodeInfo> = addrs
            .into_iter()
            .zip(infos)
            .map(|(addr, i)| i.and_then(|i| serde_json::from_str(&i).ok()).unwrap_or_else(|| NodeInfo::new(&addr, 0)))
            .collect();
        out.sort_by(|a, b| a.addr.cmp(&b.addr));
        Ok(out)
    }

    fn deregister_node(&self, addr: &str) -> MetaResult<()> {
        self.with(|c| ::redis::cmd("ZREM").arg(self.k("nodes")).arg(addr).query::<()>(c))
    }

    fn put_pool_report(&self, json: &str, ttl_ms: u64) -> MetaResult<()> {
        self.with(|c| ::redis::cmd("SET").arg(self.k("poolreport")).arg(json).arg("PX").arg(ttl_ms.max(1)).query::<()>(c))
    }

    fn pool_report(&self) -> MetaResult<Option<String>> {
        self.with(|c| ::redis::cmd("GET").arg(self.k("poolreport")).query(c))
    }
}

/// A held global directory-rename lock (freed on drop).
struct RenameLock<'a> {
    meta: &'a RedisMeta,
    token: String,
}

impl Drop for RenameLock<'_> {
    fn drop(&mut self) {
        let key = self.meta.k("rlock");
        let _ = self.meta.with(|c| UNLOCK.key(&key).arg(&self.token).invoke::<i64>(c));
    }
}

fn random_id() -> String {
    let mut raw = [0u8; 8];
    let _ = ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut raw);
    format!("{:016x}", u64::from_le_bytes(raw))
}

/// A number out of a field of an intent.
fn num(s: Option<&&str>) -> MetaResult<u64> {
    s.and_then(|s| s.parse().ok()).ok_or_else(|| MetaError::Corrupt(format!("intent field {s:?}")))
}

/// What a reply verdict (`ok`, or an errno name) means.
fn verdict(v: &str) -> MetaResult<()> {
    match v {
        "ok" | "gone" => Ok(()),
        "ECHANGED" => Err(MetaError::InFlight),
        e => Err(map_err(RedisError::from((::redis::ErrorKind::ResponseError, "verdict", e.to_string())))),
    }
}

/// Cross-slot changes of a sharded store. Each is a chain of one-slot
/// scripts started by an intent written, in the same script as the change's
/// first effect, on the name it changes (`x` hash of the directory's shard,
/// field `dir/name`). While the intent is there, other changes of that name
/// and lookups of it settle it first (`settling`); `recover` settles all
/// left by a crashed client. Every step is idempotent and each decision is
/// made once and kept (the `v:` verdicts), so any number of settlers can
/// replay a chain, in any interleaving, to the same end.
impl RedisMeta {
    /// Counts a step of a cross-slot change (an injected failure ends it here).
    fn step(&self) -> MetaResult<()> {
        use std::sync::atomic::Ordering;
        let left = self.crash_after.load(Ordering::SeqCst);
        if left == 0 {
            return Err(MetaError::Unavailable("injected failure between the steps of a cross-slot change".into()));
        }
        if left > 0 {
            self.crash_after.store(left - 1, Ordering::SeqCst);
        }
        Ok(())
    }

    /// Runs `f`, settling the intents on `names` while it finds one in flight.
    fn settling<T>(&self, names: &[(Ino, &str)], mut f: impl FnMut() -> MetaResult<T>) -> MetaResult<T> {
        for _ in 0..100 {
            match f() {
                Err(MetaError::InFlight) => {
                    for (dir, name) in names {
                        match self.settle_field(shard_of(*dir), &format!("{dir}/{name}")) {
                            Ok(()) | Err(MetaError::NotFound | MetaError::NotEmpty | MetaError::NotDir | MetaError::IsDir | MetaError::Exists | MetaError::InFlight) => {}
                            Err(e) => return Err(e),
                        }
                    }
                }
                r => return r,
            }
        }
        Err(MetaError::InFlight)
    }

    /// Settles the intent (or rename marker) on field `dir/name` of shard `k`, if any.
    fn settle_field(&self, k: usize, field: &str) -> MetaResult<()> {
        let key = format!("{}x", self.sp(k)?);
        let v: Option<String> = self.with(|c| ::redis::cmd("HGET").arg(&key).arg(field).query(c))?;
        let Some(v) = v else { return Ok(()) };
        if let Some(at) = v.strip_prefix('@') {
            // A rename's marker on its target: the intent is on its source.
            let parts: Vec<&str> = at.split('/').collect();
            let (sp, sn) = (num(parts.get(2))?, parts.get(3).copied().unwrap_or(""));
            let skey = format!("{}x", self.sp(shard_of(sp))?);
            let intent: Option<String> = self.with(|c| ::redis::cmd("HGET").arg(&skey).arg(format!("{sp}/{sn}")).query(c))?;
            return match intent {
                Some(i) => self.settle(&i).map(|_| ()),
                // Its rename is complete (the intent goes last): a marker left over.
                None => self.run_in(k, &CLEAR_INTENT, &[field.into(), v.clone()]).map(|_: i64| ()),
            };
        }
        self.settle(&v).map(|_| ())
    }

    /// Carries the change an intent describes to its end; returns what it removed.
    fn settle(&self, intent: &str) -> MetaResult<Option<Removed>> {
        let p: Vec<&str> = intent.split('/').collect();
        match p.first().copied() {
            // mk/E/D/name/mode/uid/gid/now/nowms: D/name -> E is in; E's inode next.
            Some("mk") => {
                let (e, d, name) = (num(p.get(1))?, num(p.get(2))?, p.get(3).copied().unwrap_or(""));
                self.step()?;
                let args: Vec<String> = [e.to_string(), d.to_string(), name.into()].into_iter().chain(p[4..].iter().map(|s| s.to_string())).collect();
                let _: Value = self.run_in(shard_of(e), &MKDIR2, &args)?;
                self.step()?;
                let _: i64 = self.run_in(shard_of(d), &CLEAR_INTENT, &[format!("{d}/{name}"), intent.into()])?;
                Ok(None)
            }
            // rm/id/ino/D/name/now/kind: close (a directory), remove the inode, drop the entry.
            Some("rm") => {
                let (id, ino, d, name, now) = (p.get(1).copied().unwrap_or(""), num(p.get(2))?, num(p.get(3))?, p.get(4).copied().unwrap_or(""), p.get(5).copied().unwrap_or("0"));
                let is_dir = p.get(6) == Some(&"d");
                let field = format!("{d}/{name}");
                if is_dir {
                    self.step()?;
                    let v: String = self.run_in(shard_of(ino), &CLOSE, &[ino.to_string(), id.into()])?;
                    if let Err(e) = verdict(&v) {
                        self.step()?;
                        let _: i64 = self.run_in(shard_of(d), &CLEAR_INTENT, &[field, intent.into()])?;
                        return Err(e);
                    }
                }
                self.step()?;
                let v: Vec<String> = self.run_in(shard_of(ino), &REMOVE_INODE, &[ino.to_string(), id.into()])?;
                self.step()?;
                let _: i64 = self.run_in(shard_of(d), &DROP_ENTRY, &[d.to_string(), name.into(), ino.to_string(), intent.into(), if is_dir { "1" } else { "0" }.into(), now.into()])?;
                Ok(Some(Removed { ino, chunks: entries(v, 1)? }))
            }
            Some("rn") => self.settle_rename(intent, &p),
            _ => Err(MetaError::Corrupt(format!("unknown intent {intent:?}"))),
        }
    }

    /// rn/id/sp/sn/dp/dn/src/dst/src_is_dir/dst_is_dir/now/nowms
    fn settle_rename(&self, intent: &str, p: &[&str]) -> MetaResult<Option<Removed>> {
        let s = |i: usize| p.get(i).copied().unwrap_or("");
        let (id, sp, sn, dp, dn) = (s(1), num(p.get(2))?, s(3), num(p.get(4))?, s(5));
        let (src, dst, src_dir, dst_dir, now, nowms) = (num(p.get(6))?, num(p.get(7))?, s(8), s(9), s(10), s(11));
        let sfield = format!("{sp}/{sn}");
        let marker = format!("@rn/{id}/{sp}/{sn}");
        let abort = |e: MetaError, closed: bool| -> MetaResult<Option<Removed>> {
            self.step()?;
            if closed {
                let _: i64 = self.run_in(shard_of(dst), &REOPEN, &[dst.to_string(), id.into()])?;
            }
            let _: i64 = self.run_in(shard_of(sp), &CLEAR_INTENT, &[sfield.clone(), intent.into()])?;
            Err(e)
        };
        // A directory replaced must be empty, and stay so: closed first.
        let closing = dst != 0 && dst_dir == "1";
        if closing {
            self.step()?;
            let v: String = self.run_in(shard_of(dst), &CLOSE, &[dst.to_string(), id.into()])?;
            if let Err(e) = verdict(&v) {
                return abort(e, false);
            }
        }
        self.step()?;
        let v: String = self.run_in(
            shard_of(dp),
            &RENAME_COMMIT,
            &[id.into(), dp.to_string(), dn.into(), src.to_string(), dst.to_string(), src_dir.into(), sp.to_string(), now.into(), marker.clone(), dst_dir.into()],
        )?;
        if let Err(e) = verdict(&v) {
            return abort(e, closing);
        }
        // Committed: from here on only forward.
        self.step()?;
        let _: i64 = self.run_in(shard_of(sp), &RENAME_SOURCE, &[sp.to_string(), sn.into(), src.to_string(), intent.into(), src_dir.into(), dp.to_string(), now.into()])?;
        self.step()?;
        let _: i64 = self.run_in(shard_of(src), &RENAME_INODE, &[src.to_string(), sp.to_string(), sn.into(), dp.to_string(), dn.into(), id.into(), now.into(), nowms.into()])?;
        let mut removed = None;
        if dst != 0 {
            self.step()?;
            let v: Vec<String> = self.run_in(shard_of(dst), &REMOVE_INODE, &[dst.to_string(), id.into()])?;
            removed = Some(Removed { ino: dst, chunks: entries(v, 1)? });
        }
        self.step()?;
        let _: i64 = self.run_in(shard_of(dp), &CLEAR_INTENT, &[format!("{dp}/{dn}"), marker])?;
        self.step()?;
        let _: i64 = self.run_in(shard_of(sp), &CLEAR_INTENT, &[sfield, intent.into()])?;
        Ok(removed)
    }

    /// mkdir of a directory whose shard is not its parent's.
    #[allow(clippy::too_many_arguments)]
    fn mkdir_across(&self, parent: Ino, name: &str, ino: Ino, mode: u32, uid: u32, gid: u32, now_ns: i64) -> MetaResult<Attr> {
        let intent = format!("mk/{ino}/{parent}/{name}/{mode}/{uid}/{gid}/{now_ns}/{}", now_ms());
        let _: String = self.settling(&[(parent, name)], || {
            self.run_in(shard_of(parent), &MKDIR1, &[parent.to_string(), name.into(), ino.to_string(), intent.clone(), now_ns.to_string()])
        })?;
        self.settle(&intent)?;
        self.getattr(ino)
    }

    /// unlink or rmdir of an entry whose inode is in another shard.
    fn remove_across(&self, parent: Ino, name: &str, ino: Ino, want: Kind, now_ns: i64) -> MetaResult<Removed> {
        // Kinds never change: read where the inode is.
        let kind = self.getattr(ino)?.kind;
        match (want, kind) {
            (Kind::File, Kind::Dir) => return Err(MetaError::IsDir),
            (Kind::Dir, Kind::File) => return Err(MetaError::NotDir),
            _ => {}
        }
        let intent = format!("rm/{}/{ino}/{parent}/{name}/{now_ns}/{}", random_id(), kind.code());
        let r: String = self.settling(&[(parent, name)], || {
            self.run_in(shard_of(parent), &INTENT_AT, &[parent.to_string(), name.into(), ino.to_string(), intent.clone()])
        })?;
        if r == "ECHANGED" {
            // The name was changed meanwhile: start again from it.
            return match want {
                Kind::File => self.unlink(parent, name, now_ns),
                Kind::Dir => self.rmdir(parent, name, now_ns).map(|_| Removed { ino, chunks: vec![] }),
            };
        }
        Ok(self.settle(&intent)?.unwrap_or(Removed { ino, chunks: vec![] }))
    }

    fn rename_lock(&self) -> MetaResult<RenameLock<'_>> {
        let token = random_id();
        let key = self.k("rlock");
        let start = Instant::now();
        loop {
            let got: Option<String> = self.with(|c| ::redis::cmd("SET").arg(&key).arg(&token).arg("NX").arg("PX").arg(30_000).query(c))?;
            if got.is_some() {
                return Ok(RenameLock { meta: self, token });
            }
            if start.elapsed() > Duration::from_secs(60) {
                return Err(MetaError::Unavailable("the directory-rename lock was not free for 60 s".into()));
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    /// rename as one script (every key in one slot); Corrupt("XS") when not.
    fn rename_here(&self, parent: Ino, name: &str, new_parent: Ino, new_name: &str, now_ns: i64) -> MetaResult<Option<Removed>> {
        let v: Vec<String> = self.settling(&[(parent, name), (new_parent, new_name)], || {
            self.run_in(
                shard_of(parent),
                &RENAME,
                &[parent.to_string(), name.into(), new_parent.to_string(), new_name.into(), now_ns.to_string(), now_ms_s()],
            )
        })?;
        if v.is_empty() {
            return Ok(None);
        }
        if v[0] == "XS" {
            return Err(MetaError::Corrupt("XS".into()));
        }
        let ino = v[0].parse().map_err(|_| MetaError::Corrupt("rename reply".into()))?;
        Ok(Some(Removed { ino, chunks: entries(v, 1)? }))
    }

    /// rename whose names or inodes are in several shards (the caller holds
    /// the directory-rename lock when a directory changes parent).
    fn rename_across(&self, sp: Ino, sn: &str, dp: Ino, dn: &str, now_ns: i64) -> MetaResult<Option<Removed>> {
        for _ in 0..100 {
            let src = self.lookup(sp, sn)?;
            let pk = self.getattr(dp)?.kind;
            if pk != Kind::Dir {
                return Err(MetaError::NotDir);
            }
            let dst = match self.lookup(dp, dn) {
                Ok(a) => Some(a),
                Err(MetaError::NotFound) => None,
                Err(e) => return Err(e),
            };
            if let Some(d) = &dst {
                if d.ino == src.ino {
                    return Ok(None);
                }
                match (src.kind, d.kind) {
                    (Kind::Dir, Kind::File) => return Err(MetaError::NotDir),
                    (Kind::File, Kind::Dir) => return Err(MetaError::IsDir),
                    _ => {}
                }
            }
            let bit = |k: Option<Kind>| if k == Some(Kind::Dir) { "1" } else { "0" };
            let intent = format!(
                "rn/{}/{sp}/{sn}/{dp}/{dn}/{}/{}/{}/{}/{now_ns}/{}",
                random_id(),
                src.ino,
                dst.as_ref().map_or(0, |d| d.ino),
                bit(Some(src.kind)),
                bit(dst.as_ref().map(|d| d.kind)),
                now_ms()
            );
            let r: String = self.settling(&[(sp, sn)], || {
                self.run_in(shard_of(sp), &INTENT_AT, &[sp.to_string(), sn.into(), src.ino.to_string(), intent.clone()])
            })?;
            if r == "ECHANGED" {
                continue;
            }
            match self.settle(&intent) {
                // The target changed or is busy before the commit: look again.
                Err(MetaError::InFlight) => {
                    let _ = self.settle_field(shard_of(dp), &format!("{dp}/{dn}"));
                    continue;
                }
                r => return r,
            }
        }
        Err(MetaError::InFlight)
    }

    /// Moves export keys that sharded unlinks and publishes queued in their
    /// shards (`unpubq`) to the global map, then off the queue.
    fn apply_unpublish_queues(&self) -> MetaResult<()> {
        let per: Vec<Vec<String>> = self.fan(|p| ::redis::cmd("SRANDMEMBER").arg(format!("{p}unpubq")).arg(64).clone())?;
        for (k, members) in per.into_iter().enumerate() {
            for m in members {
                let Some((ino, key)) = m.split_once('/') else { continue };
                let _: i64 = self.run(&UNPUBQ_APPLY, &[ino.into(), key.into()])?;
                let q = format!("{}unpubq", self.sp(k)?);
                self.with(|c| ::redis::cmd("SREM").arg(&q).arg(&m).query::<()>(c))?;
            }
        }
        Ok(())
    }

    fn commit_inner(&self, ino: Ino, end: u64, updates: &[ChunkUpdate], now_ns: i64, bump: bool) -> MetaResult<Vec<(u64, ChunkEntry)>> {
        let mut args = vec![
            ino.to_string(),
            end.to_string(),
            now_ns.to_string(),
            now_ms_s(),
            if bump { "1" } else { "0" }.to_string(),
            updates.len().to_string(),
        ];
        for u in updates {
            args.push(u.idx.to_string());
            args.push(u.base.unwrap_or(0).to_string());
            args.push(u.entry.encode());
        }
        let v: Vec<String> = self.run_in(shard_of(ino), &COMMIT, &args)?;
        entries(v, 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::local::{LocalCluster, LocalRedis};

    /// The store's server: a single Redis, or a Redis Cluster of 3 masters,
    /// secured as `surge bb redis` makes them (ACL user, password).
    enum Server {
        Single(LocalRedis),
        Cluster(LocalCluster),
    }

    impl Server {
        fn meta(&self, fs: &str) -> RedisMeta {
            match self {
                Server::Single(r) => RedisMeta::connect_with(&r.url(), &r.auth(), fs),
                Server::Cluster(c) => RedisMeta::connect_with(&c.url(), &c.auth(), fs),
            }
            .unwrap()
        }
    }

    type Start = fn() -> (tempfile::TempDir, Server);

    fn single() -> (tempfile::TempDir, Server) {
        let dir = tempfile::tempdir().unwrap();
        let port = crate::local::free_port().unwrap();
        let redis = LocalRedis::start_secured(&dir.path().join("redis"), port).expect("redis-server (scripts/test-all.sh installs it)");
        (dir, Server::Single(redis))
    }

    fn cluster() -> (tempfile::TempDir, Server) {
        let dir = tempfile::tempdir().unwrap();
        let c = LocalCluster::start_free(&dir.path().join("cluster"), 3, true).expect("redis-server and redis-cli (scripts/test-all.sh installs them)");
        (dir, Server::Cluster(c))
    }

    fn formatted(server: &Server) -> RedisMeta {
        let m = server.meta("t");
        m.format(&FsParams { chunk_size: 1 << 20 }).unwrap();
        m
    }

    /// Each test below runs on a single Redis and on a Redis Cluster.
    macro_rules! on_both {
        ($($name:ident),* $(,)?) => {
            mod single { $( #[test] fn $name() { super::$name(super::single) } )* }
            mod cluster { $( #[test] fn $name() { super::$name(super::cluster) } )* }
        };
    }

    on_both!(
        interleaved_creates_of_two_clients_get_distinct_inodes_and_fresh_attributes,
        getattr_with_ancestors_walks_up_to_the_root_in_one_script,
        lookup_tells_a_missing_name_from_a_parent_that_is_not_a_directory,
        a_retried_create_succeeds_and_a_different_inode_for_the_name_is_refused,
        setattr_returns_the_new_attributes_and_never_resurrects_an_inode,
        every_call_of_the_store_works_end_to_end,
        a_restarted_server_mid_workload_loses_nothing_acknowledged,
        mkdir_in_another_shard_survives_a_crash_between_its_steps,
        rmdir_across_shards_survives_a_crash_between_its_steps,
        rename_of_a_file_across_shards_survives_a_crash_between_its_steps,
        rename_of_a_directory_over_an_empty_one_across_shards_survives_a_crash_between_its_steps,
        cross_shard_changes_refuse_what_posix_refuses_and_leave_nothing_behind,
        concurrent_cross_shard_renames_keep_the_namespace_whole,
    );

    /// Creates and lookups are one round trip each and inode numbers come in
    /// per-client batches: two clients creating in turn never share a number,
    /// and what create and lookup return is what a getattr reads.
    fn interleaved_creates_of_two_clients_get_distinct_inodes_and_fresh_attributes(start: Start) {
        let (_dir, server) = start();
        let (a, b) = (formatted(&server), formatted(&server));
        let mut seen = std::collections::BTreeSet::new();
        for i in 0..(2 * INO_BATCH + 5) {
            for (who, m) in [("a", &a), ("b", &b)] {
                let name = format!("{who}{i}");
                let made = m.create(ROOT, &name, Kind::File, 0o640, 7, 8, 1_000 + i as i64).unwrap();
                assert!(seen.insert(made.ino), "inode {} given twice", made.ino);
                assert_eq!((made.name.as_str(), made.parent, made.mode, made.uid, made.size), (name.as_str(), ROOT, 0o640, 7, 0));
                let other = if who == "a" { &b } else { &a };
                assert_eq!(other.lookup(ROOT, &name).unwrap(), made);
                assert_eq!(other.getattr(made.ino).unwrap(), made);
            }
        }
        assert_eq!(a.create(ROOT, "a0", Kind::File, 0o644, 0, 0, 1).unwrap_err(), MetaError::Exists);
    }

    /// The one-script walk answers as the trait's walk of getattrs does,
    /// after a rename of a directory too, and a gone inode is NotFound.
    fn getattr_with_ancestors_walks_up_to_the_root_in_one_script(start: Start) {
        let (_dir, server) = start();
        let m = formatted(&server);
        let a = m.create(ROOT, "a", Kind::Dir, 0o755, 0, 0, 1).unwrap();
        let b = m.create(a.ino, "b", Kind::Dir, 0o755, 0, 0, 1).unwrap();
        let f = m.create(b.ino, "f", Kind::File, 0o644, 0, 0, 1).unwrap();
        let place = |ino, parent, name: &str| Placement { ino, parent, name: name.into() };
        let (attr, up) = m.getattr_with_ancestors(f.ino).unwrap();
        assert_eq!(attr, m.getattr(f.ino).unwrap());
        assert_eq!(up, vec![place(b.ino, a.ino, "b"), place(a.ino, ROOT, "a")]);
        m.rename(ROOT, "a", ROOT, "z", 2).unwrap();
        // What a getattr per directory finds (the trait's default).
        let mut walked = vec![];
        let mut dir = m.getattr(f.ino).unwrap().parent;
        while dir != ROOT {
            let d = m.getattr(dir).unwrap();
            walked.push(place(dir, d.parent, &d.name));
            dir = d.parent;
        }
        assert_eq!(m.getattr_with_ancestors(f.ino).unwrap().1, walked);
        assert_eq!(m.getattr_with_ancestors(f.ino).unwrap().1[1], place(a.ino, ROOT, "z"));
        assert_eq!(m.getattr_with_ancestors(ROOT).unwrap().1, vec![]);
        m.unlink(b.ino, "f", 3).unwrap();
        assert_eq!(m.getattr_with_ancestors(f.ino).unwrap_err(), MetaError::NotFound);
    }

    fn lookup_tells_a_missing_name_from_a_parent_that_is_not_a_directory(start: Start) {
        let (_dir, server) = start();
        let m = formatted(&server);
        let f = m.create(ROOT, "f", Kind::File, 0o644, 0, 0, 1).unwrap();
        let d = m.create(ROOT, "d", Kind::Dir, 0o755, 0, 0, 1).unwrap();
        assert_eq!(m.lookup(ROOT, "nope").unwrap_err(), MetaError::NotFound);
        assert_eq!(m.lookup(d.ino, "nope").unwrap_err(), MetaError::NotFound);
        assert_eq!(m.lookup(f.ino, "x").unwrap_err(), MetaError::NotDir);
        assert_eq!(m.lookup(d.ino + 1000, "x").unwrap_err(), MetaError::NotFound);
        assert_eq!(m.lookup(ROOT, "d").unwrap().kind, Kind::Dir);
    }

    /// A create whose reply was lost is retried with the same inode number:
    /// the retry finds its own entry and succeeds with the same attributes.
    fn a_retried_create_succeeds_and_a_different_inode_for_the_name_is_refused(start: Start) {
        let (_dir, server) = start();
        let m = formatted(&server);
        let ino = m.alloc_ino().unwrap();
        let args = |ino: u64| -> Vec<String> {
            [ROOT.to_string(), "f".into(), ino.to_string(), "f".into(), "420".into(), "0".into(), "0".into(), "5".into(), "5".into()].to_vec()
        };
        let first: HashMap<String, String> = m.run_in(0, &CREATE, &args(ino)).unwrap();
        let again: HashMap<String, String> = m.run_in(0, &CREATE, &args(ino)).unwrap();
        assert_eq!(m.parse_attr(ino, &again).unwrap(), m.parse_attr(ino, &first).unwrap());
        let other = m.alloc_ino().unwrap();
        assert_eq!(m.run_in::<HashMap<String, String>>(0, &CREATE, &args(other)).unwrap_err(), MetaError::Exists);
    }

    /// setattr on an inode removed meanwhile is NotFound and does not bring it back.
    fn setattr_returns_the_new_attributes_and_never_resurrects_an_inode(start: Start) {
        let (_dir, server) = start();
        let m = formatted(&server);
        let f = m.create(ROOT, "f", Kind::File, 0o644, 0, 0, 1).unwrap();
        let set = SetAttr { mode: Some(0o600), uid: Some(3), ..Default::default() };
        let got = m.setattr(f.ino, &set, 9).unwrap();
        assert_eq!((got.mode, got.uid, got.ctime_ns), (0o600, 3, 9));
        assert_eq!(m.getattr(f.ino).unwrap(), got);
        m.unlink(ROOT, "f", 10).unwrap();
        assert_eq!(m.setattr(f.ino, &set, 11).unwrap_err(), MetaError::NotFound);
        assert_eq!(m.getattr(f.ino).unwrap_err(), MetaError::NotFound);
    }

    fn entry(ver: u64, holders: &[&str]) -> ChunkEntry {
        ChunkEntry { ver, len: 100, persisted: false, holders: holders.iter().map(|h| h.to_string()).collect() }
    }

    /// Every call of the trait, each kind of request behind it (scripts,
    /// plain commands, pipelines, an empty pipeline), on one file system,
    /// with a second file system beside it untouched.
    fn every_call_of_the_store_works_end_to_end(start: Start) {
        let (_dir, server) = start();
        let m = formatted(&server);
        assert_eq!(m.params().unwrap().chunk_size, 1 << 20);
        let id = m.new_client_id().unwrap();
        assert!(m.new_client_id().unwrap() > id);
        let d = m.create(ROOT, "d", Kind::Dir, 0o755, 0, 0, 1).unwrap();
        let f = m.create(d.ino, "f", Kind::File, 0o644, 0, 0, 1).unwrap();
        let e = m.create(ROOT, "e", Kind::Dir, 0o755, 0, 0, 1).unwrap();
        let names = |ino| m.readdir(ino).unwrap().into_iter().map(|e| (e.name, e.kind)).collect::<Vec<_>>();
        assert_eq!(names(d.ino), vec![("f".to_string(), Kind::File)]);
        assert_eq!(names(ROOT), vec![("d".to_string(), Kind::Dir), ("e".to_string(), Kind::Dir)]);
        assert_eq!(names(e.ino), vec![]);
        assert_eq!(m.readdir(f.ino).unwrap_err(), MetaError::NotDir);

        let ups = [ChunkUpdate { idx: 0, base: None, entry: entry(1, &["n1", "n2"]) }, ChunkUpdate { idx: 1, base: None, entry: entry(2, &["n1", "n2"]) }];
        assert!(m.commit(f.ino, (1 << 20) + 100, &ups, 5).unwrap().is_empty());
        let stale = ChunkUpdate { idx: 0, base: Some(7), entry: entry(3, &["n1"]) };
        assert_eq!(m.commit(f.ino, 100, &[stale], 6).unwrap_err(), MetaError::Conflict(0));
        let (view, got) = m.chunks(f.ino, &[0, 1, 2]).unwrap();
        assert_eq!(view, FileView { size: (1 << 20) + 100, import: None });
        assert_eq!(got, vec![Some(entry(1, &["n1", "n2"])), Some(entry(2, &["n1", "n2"])), None]);
        assert_eq!(m.chunk_map(f.ino).unwrap().len(), 2);
        assert_eq!((m.dirty_count().unwrap(), m.dirty_oldest(10).unwrap().len()), (2, 2));
        let c0 = ChunkId { ino: f.ino, idx: 0, ver: 1 };
        assert!(m.is_dirty(&c0).unwrap());
        m.expedite(f.ino).unwrap();
        assert!(m.dirty_oldest(10).unwrap().iter().all(|(_, at)| *at == 0), "expedited to the front");
        assert!(m.set_holders(&c0, &["n1".into(), "n2".into()], &["n3".into(), "n2".into()]).unwrap());
        assert!(!m.drop_holder(&c0, "n9").unwrap());
        assert!(m.drop_holder(&c0, "n3").unwrap());
        assert!(!m.drop_holder(&c0, "n2").unwrap(), "the last copy of a version not in S3 stays");
        assert!(m.mark_persisted(&c0).unwrap());
        assert!(!m.is_dirty(&c0).unwrap());
        assert!(m.drop_holder(&c0, "n2").unwrap(), "in S3 now");
        let cut = m.truncate(f.ino, 100, None, 7).unwrap();
        assert_eq!(cut.iter().map(|(i, _)| *i).collect::<Vec<_>>(), vec![1]);
        assert_eq!(m.dirty_count().unwrap(), 0);

        let queued = |ino| m.publish_queue(i64::MAX, 100).unwrap().contains(&ino);
        assert!(queued(f.ino));
        assert!(m.mark_published(f.ino, m.getattr(f.ino).unwrap().gen, "d/f", false).unwrap());
        assert!(!queued(f.ino));
        m.requeue_publish(f.ino, 5).unwrap();
        assert!(queued(f.ino));
        m.drop_publish(f.ino).unwrap();
        assert!(!queued(f.ino));
        assert_eq!(m.getattr(f.ino).unwrap().xkey.as_deref(), Some("d/f"));
        assert!(m.rename(d.ino, "f", ROOT, "g", 8).unwrap().is_none());
        assert!(m.mark_published(f.ino, m.getattr(f.ino).unwrap().gen, "g", false).unwrap());
        assert_eq!(m.claim_unpublish().unwrap().as_deref(), Some("d/f"), "the old name's object goes");
        assert_eq!(m.claim_unpublish().unwrap(), None);
        m.unpublish_done("d/f").unwrap();
        assert_eq!(m.publish_pending().unwrap(), m.publish_queue(i64::MAX, 100).unwrap().len() as u64);
        let gone = m.unlink(ROOT, "g", 9).unwrap();
        assert_eq!((gone.ino, gone.chunks.len()), (f.ino, 1));
        assert_eq!(m.claim_unpublish().unwrap().as_deref(), Some("g"));
        m.rmdir(ROOT, "d", 10).unwrap();
        let i = m.import_file(ROOT, "obj", "obj", 1234, 11).unwrap();
        assert_eq!((i.size, i.import), (1234, Some(("obj".to_string(), 1234))));

        let node = NodeInfo::new("127.0.0.1:7401", 1 << 30);
        m.register_node(&node, 60_000).unwrap();
        assert_eq!(m.live_nodes().unwrap(), vec![node.clone()]);
        m.deregister_node(&node.addr).unwrap();
        assert_eq!(m.live_nodes().unwrap(), vec![]);
        m.put_pool_report("{}", 60_000).unwrap();
        assert_eq!(m.pool_report().unwrap().as_deref(), Some("{}"));

        let other = server.meta("u");
        other.format(&FsParams { chunk_size: 4096 }).unwrap();
        assert_eq!((other.readdir(ROOT).unwrap().len(), other.params().unwrap().chunk_size, other.live_nodes().unwrap().len()), (0, 4096, 0));
    }

    /// A client creating and committing while its server is killed (SIGKILL)
    /// and started again: calls in flight retry until it is back, and every
    /// create and commit acknowledged before, during or after is there
    /// (append-only, fsync always). On a cluster, the master killed is the
    /// one holding the root's shard.
    fn a_restarted_server_mid_workload_loses_nothing_acknowledged(start: Start) {
        use std::sync::atomic::{AtomicBool, Ordering};
        let (_dir, mut server) = start();
        let m = formatted(&server).with_retry_for(Duration::from_secs(30));
        let acked = Mutex::new(Vec::new());
        let done = AtomicBool::new(false);
        let failed = Mutex::new(None::<String>);
        let count = || acked.lock().len();
        let wait_for = |n: usize| {
            let t = Instant::now();
            while count() < n && failed.lock().is_none() {
                assert!(t.elapsed() < Duration::from_secs(30), "the writer is stuck at {} files", count());
                std::thread::sleep(Duration::from_millis(5));
            }
        };
        let before = std::thread::scope(|s| {
            s.spawn(|| {
                for i in 0u64.. {
                    if done.load(Ordering::Relaxed) {
                        break;
                    }
                    let f = m.create(ROOT, &format!("f{i}"), Kind::File, 0o644, 0, 0, i as i64).unwrap();
                    let up = ChunkUpdate { idx: 0, base: None, entry: entry(i + 1, &["n1"]) };
                    if let Err(e) = m.commit(f.ino, 100, &[up], i as i64) {
                        *failed.lock() = Some(format!("commit of f{i} (ino {}): {e}", f.ino));
                        break;
                    }
                    acked.lock().push((i, f.ino));
                }
            });
            wait_for(20);
            let before = count();
            match &mut server {
                Server::Single(r) => r.restart().unwrap(),
                Server::Cluster(c) => {
                    // The master of the root's shard, where the files are.
                    let owner = c.owner_of(&format!("{}meta", m.shard_prefixes()[0])).unwrap();
                    c.restart(owner).unwrap();
                }
            }
            wait_for(count() + 20);
            done.store(true, Ordering::Relaxed);
            before
        });
        if let Some(e) = failed.into_inner() {
            panic!("{e}");
        }
        assert!(before < acked.lock().len());
        let fresh = server.meta("t");
        let acked = acked.into_inner();
        let lost: Vec<_> = acked.iter().filter(|(i, ino)| fresh.lookup(ROOT, &format!("f{i}")).map(|a| a.ino) != Ok(*ino)).collect();
        assert!(lost.is_empty(), "acknowledged creates lost: {lost:?} of {} (the restart came after {before})", acked.len());
        for (i, ino) in &acked {
            assert_eq!(fresh.chunk_map(*ino).unwrap()[&0].ver, i + 1, "f{i}'s chunk");
        }
        assert_eq!(fresh.readdir(ROOT).unwrap().len(), acked.len(), "no file beyond the acknowledged (a replay made none twice)");
    }

    /// Unsharded (one shard: as file systems formatted before shards were),
    /// all keys of one file system are on the master of its hash tag's slot,
    /// and file systems with other tags are on other masters.
    #[test]
    fn an_unsharded_file_system_is_whole_on_one_master_and_file_systems_spread_over_all() {
        let (_dir, server) = cluster();
        let Server::Cluster(c) = &server else { unreachable!() };
        let names: Vec<String> = (0..12).map(|i| format!("fs{i}")).collect();
        let owners: Vec<usize> = names.iter().map(|n| c.owner_of(&format!("bb:{{{n}}}:meta")).unwrap()).collect();
        let mut used = owners.clone();
        used.sort_unstable();
        used.dedup();
        assert_eq!(used, vec![0, 1, 2], "12 file systems on 3 masters: {owners:?}");
        let mut per_master = vec![0usize; 3];
        for n in &names {
            let m = server.meta(n).with_shards(1);
            m.format(&FsParams { chunk_size: 1 << 20 }).unwrap();
            assert_eq!(m.shard_count(), 1);
            let d = m.create(ROOT, "d", Kind::Dir, 0o755, 0, 0, 1).unwrap();
            let f = m.create(d.ino, "f", Kind::File, 0o644, 0, 0, 1).unwrap();
            m.commit(f.ino, 100, &[ChunkUpdate { idx: 0, base: None, entry: entry(1, &["n1"]) }], 2).unwrap();
            m.register_node(&NodeInfo::new("127.0.0.1:7401", 1), 60_000).unwrap();
        }
        for i in 0..3 {
            let keys = c.keys_on(i);
            for (n, &owner) in names.iter().zip(&owners) {
                let mine = keys.iter().filter(|k| k.starts_with(&format!("bb:{{{n}}}:"))).count();
                if owner == i {
                    // meta, i:1, d:1, i:d, d:d, i:f, c:f, dirty, pub, nodes, nodeinfo
                    assert_eq!(mine, 11, "{n} on master {i}: {keys:?}");
                    per_master[i] += 1;
                } else {
                    assert_eq!(mine, 0, "{n} has keys on master {i}, not its owner {owner}");
                }
            }
        }
        assert!(per_master.iter().all(|&n| n > 0), "{per_master:?}");
    }

    /// A cluster URL with a wrong password, or naming a plain Redis, fails
    /// at connect with what is wrong, not at the first file.
    #[test]
    fn a_cluster_url_says_why_it_cannot_be_used() {
        let (_dir, server) = cluster();
        let Server::Cluster(c) = &server else { unreachable!() };
        let wrong = RedisAuth { password: Some("nope".into()), ..c.auth() };
        let e = RedisMeta::connect_with(&c.url(), &wrong, "t").err().unwrap().to_string();
        assert!(e.contains("refused us"), "{e}");
        let e = RedisMeta::connect(&c.url(), "t").err().unwrap().to_string();
        assert!(e.contains("refused us"), "no login: {e}");
        let e = RedisMeta::connect_with(&c.url(), &c.auth(), "a{b}").err().unwrap().to_string();
        assert!(e.contains("without braces"), "{e}");
        let sdir = tempfile::tempdir().unwrap();
        let r = LocalRedis::start(sdir.path(), crate::local::free_port().unwrap()).unwrap();
        let url = format!("{CLUSTER_SCHEME}127.0.0.1:{}/", r.port);
        let e = RedisMeta::connect(&url, "t").err().unwrap().to_string();
        assert!(e.contains("not a cluster node"), "{e}");
        assert!(RedisMeta::connect_with(&c.url(), &c.auth(), "t").is_ok());
    }

    /// A cluster URL's seeds each keep its login; logs show it redacted.
    #[test]
    fn a_cluster_url_names_its_seeds_with_the_login_and_is_redacted_for_logs() {
        let url = "redis+cluster://bb:s3cret@10.0.0.1:7000,10.0.0.2:7001/";
        assert_eq!(cluster_nodes(url).unwrap(), vec!["redis://bb:s3cret@10.0.0.1:7000/", "redis://bb:s3cret@10.0.0.2:7001/"]);
        assert_eq!(redact(url), "redis+cluster://bb:***@10.0.0.1:7000,10.0.0.2:7001/");
        assert_eq!(cluster_nodes("redis://10.0.0.1:6379/"), None);
        assert_eq!(cluster_nodes("redis+cluster:///"), Some(vec![]));
        let e = RedisMeta::connect("redis+cluster:///", "t").err().unwrap().to_string();
        assert!(e.contains("no host:port"), "{e}");
        let e = RedisMeta::connect("redis+cluster://127.0.0.1:1/2", "t").err().unwrap().to_string();
        assert!(e.contains("database 0 only"), "{e}");
    }

    /// Sharded (the cluster default), one file system's shards are spread
    /// evenly over the masters, a directory's files are in its shard with
    /// it, and directories land in shards by hash of (parent, name).
    #[test]
    fn a_sharded_file_system_spreads_evenly_over_the_masters_with_each_directory_whole() {
        let (_dir, server) = cluster();
        let Server::Cluster(c) = &server else { unreachable!() };
        let m = formatted(&server);
        assert_eq!(m.shard_count(), CLUSTER_SHARDS);
        let mut per_master = [0usize; 3];
        for p in m.shard_prefixes() {
            per_master[c.owner_of(&format!("{p}meta")).unwrap()] += 1;
        }
        assert!(per_master.iter().all(|&n| n >= CLUSTER_SHARDS / 3 - 1 && n <= CLUSTER_SHARDS / 3 + 1), "{per_master:?}");
        let mut dir_shards = std::collections::BTreeSet::new();
        for i in 0..24 {
            let d = m.create(ROOT, &format!("d{i}"), Kind::Dir, 0o755, 0, 0, 1).unwrap();
            dir_shards.insert(shard_of(d.ino));
            for j in 0..3 {
                let f = m.create(d.ino, &format!("f{j}"), Kind::File, 0o644, 0, 0, 1).unwrap();
                assert_eq!(shard_of(f.ino), shard_of(d.ino), "a file is in its directory's shard");
            }
            assert_eq!(m.readdir(d.ino).unwrap().len(), 3);
        }
        assert!(dir_shards.len() >= 12, "24 directories in {} shards only", dir_shards.len());
        let owners: std::collections::BTreeSet<usize> =
            dir_shards.iter().map(|&k| c.owner_of(&format!("{}meta", m.shard_prefixes()[k])).unwrap()).collect();
        assert_eq!(owners.len(), 3, "directories on every master");
        assert_eq!(fsck(&m), Vec::<String>::new());
    }

    /// What is wrong with the namespace: every entry's inode there and
    /// naming it back, directory link counts 2 + subdirectories, no intent
    /// left, no directory left closed, and every inode of every shard
    /// reachable from the root.
    fn fsck(m: &RedisMeta) -> Vec<String> {
        let mut bad = vec![];
        let mut seen = std::collections::BTreeSet::from([ROOT]);
        let mut todo = vec![ROOT];
        while let Some(d) = todo.pop() {
            let da = m.getattr(d).unwrap();
            let key = m.ki(d, &format!("d:{d}")).unwrap();
            let names: Vec<(String, u64)> = m.with(|c| ::redis::cmd("HGETALL").arg(&key).query(c)).unwrap();
            let mut subdirs = 0;
            for (name, ino) in names {
                match m.getattr(ino) {
                    Err(e) => bad.push(format!("{d}/{name} -> {ino}: {e}")),
                    Ok(a) => {
                        if (a.parent, a.name.as_str()) != (d, name.as_str()) {
                            bad.push(format!("{d}/{name} -> {ino}, which says it is {}/{}", a.parent, a.name));
                        }
                        if !seen.insert(ino) {
                            bad.push(format!("{ino} has two names"));
                        }
                        if a.kind == Kind::Dir {
                            subdirs += 1;
                            todo.push(ino);
                        }
                    }
                }
            }
            if da.nlink != 2 + subdirs {
                bad.push(format!("directory {d} has nlink {} for {subdirs} subdirectories", da.nlink));
            }
            let cl: bool = m.with(|c| ::redis::cmd("HEXISTS").arg(m.ki(d, &format!("i:{d}")).unwrap()).arg("cl").query(c)).unwrap();
            if cl {
                bad.push(format!("directory {d} is left closed"));
            }
        }
        for (k, p) in m.shard_prefixes().iter().enumerate() {
            let x: Vec<String> = m.with(|c| ::redis::cmd("HKEYS").arg(format!("{p}x")).query(c)).unwrap();
            if !x.is_empty() {
                bad.push(format!("intents left in shard {k}: {x:?}"));
            }
            // Every inode of the shard (its counter bounds the numbers it gave).
            let next: u64 = m.with(|c| ::redis::cmd("HGET").arg(format!("{p}meta")).arg("next_ino").query(c)).unwrap();
            for seq in 1..=next {
                let ino = ((k as u64) << SHARD_SHIFT) | seq;
                let there: bool = m.with(|c| ::redis::cmd("EXISTS").arg(format!("{p}i:{ino}")).query(c)).unwrap();
                if there && !seen.contains(&ino) {
                    bad.push(format!("inode {ino} is not reachable from the root"));
                }
            }
        }
        bad
    }

    /// The namespace as names: path -> kind.
    fn tree(m: &RedisMeta) -> BTreeMap<String, Kind> {
        let mut out = BTreeMap::new();
        let mut todo = vec![(ROOT, String::new())];
        while let Some((d, path)) = todo.pop() {
            for e in m.readdir(d).unwrap() {
                let p = format!("{path}/{}", e.name);
                if e.kind == Kind::Dir {
                    todo.push((e.ino, p.clone()));
                }
                out.insert(p, e.kind);
            }
        }
        out
    }

    /// Directories in distinct shards, found by name (a sharded store puts
    /// directories by hash): `n` directories under the root, each in a shard
    /// of its own and none in the root's.
    fn dirs_apart(m: &RedisMeta, n: usize) -> Vec<Attr> {
        let mut out: Vec<Attr> = vec![];
        for i in 0.. {
            let name = format!("dir{i}");
            let k = m.dir_shard(ROOT, &name);
            if k != 0 && out.iter().all(|d| shard_of(d.ino) != k) {
                out.push(m.create(ROOT, &name, Kind::Dir, 0o755, 0, 0, 1).unwrap());
                if out.len() == n {
                    break;
                }
            }
        }
        out
    }

    /// A cross-slot change, failed after each of its steps in turn as if
    /// its client died there, then a recovery pass by another client: the
    /// namespace is whole (fsck) and is either all before or all after.
    fn crash_at_every_step(
        start: Start,
        what: &str,
        setup: impl Fn(&RedisMeta) -> Vec<u64>,
        change: impl Fn(&RedisMeta, &[u64]) -> MetaResult<()>,
    ) {
        let (_dir, server) = start();
        let mut completed_at = None;
        for steps in 0..20 {
            let fs = format!("{what}{steps}");
            let m = server.meta(&fs).with_shards(8);
            m.format(&FsParams { chunk_size: 1 << 20 }).unwrap();
            let ids = setup(&m);
            let before = tree(&m);
            m.inject_crash_after(steps);
            let r = change(&m, &ids);
            let crashed = matches!(&r, Err(MetaError::Unavailable(e)) if e.contains("injected"));
            if !crashed {
                r.unwrap_or_else(|e| panic!("{what} with no crash: {e}"));
                completed_at = Some(steps);
            }
            // Another client: a lookup may settle it, the recovery pass does.
            let other = server.meta(&fs);
            other.recover().unwrap();
            assert_eq!(fsck(&other), Vec::<String>::new(), "{what} crashed after {steps} steps");
            let after = tree(&other);
            // What the change makes, done again from `before` without crash.
            let fresh = format!("{what}{steps}ref");
            let r2 = server.meta(&fresh).with_shards(8);
            r2.format(&FsParams { chunk_size: 1 << 20 }).unwrap();
            let ids2 = setup(&r2);
            change(&r2, &ids2).unwrap();
            let done = tree(&r2);
            // Its intent was written before its first step: recovery
            // carries it through, never loses it half-way.
            assert_eq!(after, done, "{what} crashed after {steps} steps (before: {before:?})");
            if completed_at.is_some() {
                break;
            }
        }
        assert!(completed_at.is_some_and(|s| s >= 2), "{what} never got past its injected failures: {completed_at:?}");
    }

    fn mkdir_in_another_shard_survives_a_crash_between_its_steps(start: Start) {
        crash_at_every_step(start, "mkdir", |m| dirs_apart(m, 1).iter().map(|d| d.ino).collect(), |m, ids| {
            // A name whose directory hashes away from the parent's shard.
            let name = (0..).map(|i| format!("sub{i}")).find(|n| m.dir_shard(ids[0], n) != shard_of(ids[0])).unwrap();
            m.create(ids[0], &name, Kind::Dir, 0o755, 0, 0, 2).map(|_| ())
        });
    }

    fn rmdir_across_shards_survives_a_crash_between_its_steps(start: Start) {
        crash_at_every_step(start, "rmdir", |m| dirs_apart(m, 1).iter().map(|d| d.ino).collect(), |m, ids| {
            let name = m.getattr(ids[0]).unwrap().name;
            m.rmdir(ROOT, &name, 2)
        });
    }

    fn rename_of_a_file_across_shards_survives_a_crash_between_its_steps(start: Start) {
        crash_at_every_step(
            start,
            "renf",
            |m| {
                let d = dirs_apart(m, 2);
                m.create(d[0].ino, "f", Kind::File, 0o644, 0, 0, 1).unwrap();
                m.create(d[1].ino, "g", Kind::File, 0o644, 0, 0, 1).unwrap();
                vec![d[0].ino, d[1].ino]
            },
            // Replacing g: the replaced file's inode goes too.
            |m, ids| m.rename(ids[0], "f", ids[1], "g", 2).map(|_| ()),
        );
    }

    fn rename_of_a_directory_over_an_empty_one_across_shards_survives_a_crash_between_its_steps(start: Start) {
        crash_at_every_step(
            start,
            "rend",
            |m| {
                let d = dirs_apart(m, 3);
                m.create(d[0].ino, "f", Kind::File, 0o644, 0, 0, 1).unwrap();
                // d0 moves into d1 over d1/x, an empty directory of d2's.
                m.rename(ROOT, &d[2].name, d[1].ino, "x", 1).unwrap();
                vec![d[0].ino, d[1].ino]
            },
            |m, ids| {
                let name = m.getattr(ids[0]).unwrap().name;
                m.rename(ROOT, &name, ids[1], "x", 2).map(|_| ())
            },
        );
    }

    /// Each cross-slot change's refusals: rmdir of a directory that is not
    /// empty, a rename over a non-empty directory, a directory moved under
    /// itself, a create in a directory being removed (closed).
    fn cross_shard_changes_refuse_what_posix_refuses_and_leave_nothing_behind(start: Start) {
        let (_dir, server) = start();
        let m = server.meta("t").with_shards(8);
        m.format(&FsParams { chunk_size: 1 << 20 }).unwrap();
        let d = dirs_apart(&m, 3);
        m.create(d[0].ino, "f", Kind::File, 0o644, 0, 0, 1).unwrap();
        assert_eq!(m.rmdir(ROOT, &d[0].name, 2).unwrap_err(), MetaError::NotEmpty);
        assert_eq!(m.rename(ROOT, &d[1].name, ROOT, &d[0].name, 2).unwrap_err(), MetaError::NotEmpty);
        m.rename(ROOT, &d[1].name, d[0].ino, "inner", 2).unwrap();
        assert_eq!(m.rename(ROOT, &d[0].name, d[1].ino, "loop", 3).unwrap_err(), MetaError::Invalid);
        assert_eq!(m.rename(ROOT, &d[2].name, d[0].ino, "f", 3).unwrap_err(), MetaError::NotDir);
        assert_eq!(m.unlink(d[0].ino, "inner", 3).unwrap_err(), MetaError::IsDir);
        assert_eq!(m.rmdir(d[0].ino, "f", 3).unwrap_err(), MetaError::NotDir);
        // A directory closed by an rmdir whose client died before it
        // removed the entry: creates in it are refused, recovery completes it.
        let e = m.create(d[2].ino, "gone", Kind::Dir, 0o755, 0, 0, 3).unwrap();
        let crashed = (0..6).find(|&steps| {
            m.inject_crash_after(steps);
            let r = m.rmdir(d[2].ino, "gone", 4);
            m.inject_crash_after(-1);
            r.is_err() && m.getattr(e.ino).is_ok_and(|a| a.kind == Kind::Dir) && {
                let closed: bool = m.with(|c| ::redis::cmd("HEXISTS").arg(m.ki(e.ino, &format!("i:{}", e.ino)).unwrap()).arg("cl").query(c)).unwrap();
                closed
            }
        });
        if crashed.is_some() {
            assert_eq!(m.create(e.ino, "late", Kind::File, 0o644, 0, 0, 5).unwrap_err(), MetaError::NotFound);
            // A lookup of the name settles the rmdir: gone.
            assert_eq!(server.meta("t").lookup(d[2].ino, "gone").unwrap_err(), MetaError::NotFound);
        } else {
            assert!(shard_of(e.ino) == shard_of(d[2].ino), "a cross-shard rmdir never stopped closed");
        }
        assert_eq!(fsck(&m), Vec::<String>::new());
        let t = tree(&m);
        assert!(t.contains_key(&format!("/{}/inner", d[0].name)) && t.contains_key(&format!("/{}/f", d[0].name)), "{t:?}");
    }

    /// Many clients renaming, creating and removing across shards at once
    /// (threads, each its own connection): the namespace stays whole and
    /// every file is found under exactly one name.
    fn concurrent_cross_shard_renames_keep_the_namespace_whole(start: Start) {
        let (_dir, server) = start();
        let m = server.meta("t").with_shards(8);
        m.format(&FsParams { chunk_size: 1 << 20 }).unwrap();
        let d = dirs_apart(&m, 4);
        let dirs: Vec<Ino> = d.iter().map(|a| a.ino).collect();
        for i in 0..8 {
            m.create(dirs[i % 4], &format!("f{i}"), Kind::File, 0o644, 0, 0, 1).unwrap();
        }
        std::thread::scope(|s| {
            for t in 0..4u64 {
                let (server, dirs) = (&server, &dirs);
                s.spawn(move || {
                    let c = server.meta("t");
                    for round in 0..40u64 {
                        let (from, to) = (dirs[((t + round) % 4) as usize], dirs[((t + round + 1) % 4) as usize]);
                        for e in c.readdir(from).unwrap() {
                            if e.kind == Kind::File {
                                match c.rename(from, &e.name, to, &e.name, round as i64) {
                                    Ok(_) | Err(MetaError::NotFound) => {}
                                    Err(err) => panic!("rename {}: {err}", e.name),
                                }
                            }
                        }
                        let sub = format!("s{t}");
                        match c.create(from, &sub, Kind::Dir, 0o755, 0, 0, 1) {
                            Ok(_) | Err(MetaError::Exists) => {}
                            Err(err) => panic!("mkdir: {err}"),
                        }
                        match c.rmdir(from, &sub, 2) {
                            Ok(_) | Err(MetaError::NotFound) => {}
                            Err(err) => panic!("rmdir: {err}"),
                        }
                    }
                });
            }
        });
        assert_eq!(fsck(&m), Vec::<String>::new());
        let files: Vec<String> = tree(&m).into_iter().filter(|(_, k)| *k == Kind::File).map(|(p, _)| p.rsplit('/').next().unwrap().to_string()).collect();
        let mut names = files.clone();
        names.sort();
        assert_eq!(names, (0..8).map(|i| format!("f{i}")).collect::<Vec<_>>(), "{files:?}");
    }

}
