# The files (<files><file>) and scripts of a rendered AutoYaST profile, as the installer needs
# them: each file under `target` (a path ending in "/" is a directory) with its permissions;
# each script that runs outside the target (<chrooted>false</chrooted>) as scripts/NN-name.
function flush_text(line, end_tag,    i) {
  i = index(line, end_tag)
  if (i) { text = text substr(line, 1, i - 1); return 1 }
  text = text line "\n"; return 0
}
function value(line, tag,    s) {
  s = line; sub(".*<" tag "[^>]*>", "", s); sub("</" tag ">.*", "", s); return s
}
BEGIN { n = 0; in_text = "" }
in_text != "" {
  if (flush_text($0, "]]></" in_text ">")) in_text = ""
  next
}
/<file>/ { path = ""; perms = ""; text = ""; kind = "file" }
/<script>/ { name = ""; chrooted = "false"; text = ""; kind = "script" }
/<file_path>/ { path = value($0, "file_path") }
/<file_permissions>/ { perms = value($0, "file_permissions") }
/<filename>/ { name = value($0, "filename") }
/<chrooted[ >]/ { chrooted = value($0, "chrooted") }
/<(file_contents|source)><!\[CDATA\[/ {
  tag = ($0 ~ /<file_contents>/) ? "file_contents" : "source"
  rest = $0; sub(".*<" tag "><!\\[CDATA\\[", "", rest)
  text = ""
  if (!flush_text(rest, "]]></" tag ">")) in_text = tag
  next
}
/<\/file>/ {
  if (path ~ /\/$/) { system("mkdir -p '" target path "'") }
  else if (path != "") {
    dest = target path; dir = dest; sub("/[^/]*$", "", dir)
    system("mkdir -p '" dir "'")
    printf "%s", text > dest; close(dest)
    if (perms != "") system("chmod " perms " '" dest "'")
  }
  kind = ""
}
/<\/script>/ {
  if (chrooted == "false" && text != "") {
    n++; dest = sprintf("%s/%02d-%s", scripts, n, name)
    printf "%s", text > dest; close(dest)
  }
  kind = ""
}
