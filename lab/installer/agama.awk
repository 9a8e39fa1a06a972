# The files and post-installation scripts of a rendered Agama profile (JSON), as the installer
# needs them (the JSON twin of profile.awk): each of `files` under `target` with its
# permissions (Agama's default 0644); each of `scripts.post` that runs outside the target
# ("chroot": false; Agama's default is true, and chrooted scripts are not the lab's to run) as
# scripts/NN-name. `pre`, `postPartitioning` and `init` scripts are not run here either.
# The whole document is read as JSON (RFC 8259, strictly: what Agama would refuse, this refuses)
# into val/typ/cnt by path, e.g. files[0].destination; the parts read here are checked against
# Agama's profile schema (rust/share/profile.schema.json). Any error: one line on stderr naming
# the path, exit 1. Only busybox awk is needed; bytes pass through as they are, \uXXXX escapes
# become UTF-8.
function fail(msg) {
  printf "store-installer: profile: %s\n", msg | "cat >&2"
  close("cat >&2"); exit 1
}
function near(    s) {
  s = substr(doc, pos, 30); gsub(/[\r\n]/, " ", s)
  return "at byte " pos ": " s
}
function ws() { while (pos <= len && index(" \t\r\n", substr(doc, pos, 1))) pos++ }
function member(path, key) { return path == "" ? key : path "." key }
function where(path) { return path == "" ? "the profile" : path }
function hexval(h,    i, v) {
  v = 0
  for (i = 1; i <= 4; i++) v = v * 16 + index("0123456789abcdef", tolower(substr(h, i, 1))) - 1
  return v
}
function utf8(cp) {
  if (cp < 128) return sprintf("%c", cp)
  if (cp < 2048) return sprintf("%c%c", 192 + int(cp / 64), 128 + cp % 64)
  if (cp < 65536)
    return sprintf("%c%c%c", 224 + int(cp / 4096), 128 + int(cp / 64) % 64, 128 + cp % 64)
  return sprintf("%c%c%c%c", 240 + int(cp / 262144), 128 + int(cp / 4096) % 64,
                 128 + int(cp / 64) % 64, 128 + cp % 64)
}
function hex4(path,    h) {
  h = substr(doc, pos, 4)
  if (h !~ /^[0-9A-Fa-f][0-9A-Fa-f][0-9A-Fa-f][0-9A-Fa-f]$/)
    fail(path ": \\u needs four hex digits " near())
  pos += 4
  return hexval(h)
}
# the string at pos (its opening quote), decoded
function str(path,    out, rest, q, b, end, e, cp, lo) {
  pos++; out = ""
  while (1) {
    rest = substr(doc, pos)
    q = index(rest, "\""); b = index(rest, "\\")
    if (!q) fail(path ": a string without its closing quote " near())
    end = (b && b < q) ? b : q
    if (substr(rest, 1, end - 1) ~ CONTROL)
      fail(path ": a raw control character (a line break?) in a string: JSON writes \\n " near())
    out = out substr(rest, 1, end - 1); pos += end
    if (end == q) return out
    e = substr(doc, pos, 1); pos++
    if (e == "\"" || e == "\\" || e == "/") out = out e
    else if (e == "n") out = out "\n"
    else if (e == "t") out = out "\t"
    else if (e == "r") out = out "\r"
    else if (e == "b") out = out "\b"
    else if (e == "f") out = out "\f"
    else if (e == "u") {
      cp = hex4(path)
      if (cp >= 56320 && cp < 57344) fail(path ": a lone low surrogate " near())
      if (cp >= 55296 && cp < 56320) {
        if (substr(doc, pos, 2) != "\\u")
          fail(path ": a high surrogate without its low one " near())
        pos += 2; lo = hex4(path)
        if (lo < 56320 || lo >= 57344) fail(path ": a high surrogate without its low one " near())
        cp = 65536 + (cp - 55296) * 1024 + (lo - 56320)
      }
      if (cp == 0) fail(path ": \\u0000 (a NUL byte) cannot be written by the installer")
      out = out utf8(cp)
    } else fail(path ": unknown escape \\" e " " near())
  }
}
function value(path,    c, tok) {
  ws()
  if (pos > len) fail(where(path) ": a value expected, the text ended")
  c = substr(doc, pos, 1)
  if (c == "{") { object(path); return }
  if (c == "[") { array(path); return }
  if (c == "\"") { typ[path] = "string"; val[path] = str(path); return }
  if (match(substr(doc, pos, 100),
            /^(true|false|null|-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][-+]?[0-9]+)?)/)) {
    tok = substr(doc, pos, RLENGTH); pos += RLENGTH; val[path] = tok
    typ[path] = (tok == "true" || tok == "false") ? "boolean" : (tok == "null" ? "null" : "number")
    return
  }
  fail(where(path) ": no JSON value " near())
}
function object(path,    key, c) {
  typ[path] = "object"; keys[path] = ""; pos++; ws()
  if (substr(doc, pos, 1) == "}") { pos++; return }
  while (1) {
    ws()
    if (substr(doc, pos, 1) != "\"") fail(where(path) ": a member name expected " near())
    key = str(path)
    if (member(path, key) in typ) fail(member(path, key) ": given twice")
    ws()
    if (substr(doc, pos, 1) != ":") fail(member(path, key) ": ':' expected " near())
    pos++
    keys[path] = keys[path] " " key
    value(member(path, key))
    ws(); c = substr(doc, pos, 1); pos++
    if (c == "}") return
    if (c != ",") { pos--; fail(where(path) ": ',' or '}' expected " near()) }
  }
}
function array(path,    n, c) {
  typ[path] = "array"; pos++; n = 0; ws()
  if (substr(doc, pos, 1) == "]") { pos++; cnt[path] = 0; return }
  while (1) {
    value(path "[" n "]"); n++
    ws(); c = substr(doc, pos, 1); pos++
    if (c == "]") { cnt[path] = n; return }
    if (c != ",") { pos--; fail(path ": ',' or ']' expected " near()) }
  }
}
function article(type) { return (type ~ /^[aeiou]/ ? "an " : "a ") type }
function need(path, type, what) {
  if (!(path in typ)) fail(path ": missing (" what ")")
  if (typ[path] != type)
    fail(path ": " article(type) " expected, not " article(typ[path]) " (" what ")")
}
# the object at path has only the members Agama's schema allows there
function only(path, allowed,    n, names, i) {
  n = split(keys[path], names, " ")
  for (i = 1; i <= n; i++)
    if (index(" " allowed " ", " " names[i] " ") == 0)
      fail(member(path, names[i]) ": not in Agama's profile schema (allowed: " allowed ")")
}
function sq(s,    n, parts, i, out) {  # s as one shell word
  n = split(s, parts, "'"); out = "'" parts[1]
  for (i = 2; i <= n; i++) out = out "'\\''" parts[i]
  return out "'"
}
function write(dest, text, perms,    dir) {
  dir = dest; sub("/[^/]*$", "", dir)
  if (system("mkdir -p " sq(dir)) != 0) fail(dest ": cannot create " dir)
  printf "%s", text > dest; close(dest)
  if (perms != "" && system("chmod " perms " " sq(dest)) != 0) fail(dest ": chmod " perms)
}
# the entry of a list at p: an object with only the members Agama's schema allows, its text
# in the profile (the lab's installer fetches no url)
function entry(p, what, allowed) {
  need(p, "object", what)
  only(p, allowed)
  if ((p ".url") in typ)
    fail(p ".url: the lab's installer fetches nothing: put the text in content")
}
function lay_down_files(    i, p, dest, perms) {
  if (!("files" in typ)) return
  need("files", "array", "the files to deploy")
  for (i = 0; i < cnt["files"]; i++) {
    p = "files[" i "]"
    entry(p, "a file to deploy", "destination content url permissions user group")
    need(p ".destination", "string", "the file's absolute path")
    dest = val[p ".destination"]
    if (dest !~ /^\/./ || dest ~ /\/$/ || dest ~ /(^|\/)\.\.(\/|$)/)
      fail(p ".destination '" dest "': an absolute path to a file, without ..")
    need(p ".content", "string", "the file's text")
    perms = "0644"
    if ((p ".permissions") in typ) {
      need(p ".permissions", "string", "octal, e.g. \"0600\"")
      perms = val[p ".permissions"]
      if (perms !~ /^[0-7]?[0-7][0-7][0-7]$/)
        fail(p ".permissions '" perms "': octal, e.g. \"0600\"")
    }
    if ((p ".user") in typ) need(p ".user", "string", "the owner's name")
    if ((p ".group") in typ) need(p ".group", "string", "the group's name")
    write(target dest, val[p ".content"], perms)
  }
}
function save_post_scripts(    i, n, p, name, field, text, chroot, list) {
  if (!("scripts" in typ)) return
  need("scripts", "object", "the scripts to run")
  only("scripts", "pre postPartitioning post init")
  split("pre postPartitioning post init", list, " ")
  for (i = 1; i <= 4; i++)
    if (("scripts." list[i]) in typ) need("scripts." list[i], "array", "a list of scripts")
  n = 0
  for (i = 0; i < cnt["scripts.post"]; i++) {
    p = "scripts.post[" i "]"
    entry(p, "a post-installation script", "name body content url chroot")
    need(p ".name", "string", "the script's file name")
    name = val[p ".name"]
    if (name == "" || name ~ /\// || name ~ /^\.\.?$/) fail(p ".name '" name "': a file name")
    if (((p ".content") in typ) == ((p ".body") in typ))
      fail(p ": one of content (or the deprecated body) expected")
    field = p (((p ".content") in typ) ? ".content" : ".body")
    need(field, "string", "the script, from its #! line")
    text = val[field]
    chroot = "true"
    if ((p ".chroot") in typ) {
      need(p ".chroot", "boolean", "whether it runs in the installed system")
      chroot = val[p ".chroot"]
    }
    if (chroot == "true") continue
    # Agama runs it as a program: without its #! line it cannot start
    if (substr(text, 1, 2) != "#!") fail(field ": no #! line: Agama runs the script as a program")
    n++
    write(sprintf("%s/%02d-%s", scripts, n, name), text, "")
  }
}
BEGIN { doc = ""; CONTROL = "[" sprintf("%c", 1) "-" sprintf("%c", 31) "]" }
{ doc = doc $0 "\n" }
END {
  len = length(doc); pos = 1
  value("")
  ws()
  if (pos <= len) fail("text after the profile's closing } " near())
  if (typ[""] != "object") fail("the profile: a JSON object ({...}) expected")
  lay_down_files()
  save_post_scripts()
}
