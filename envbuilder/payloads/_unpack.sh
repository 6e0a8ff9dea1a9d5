#!/bin/sh
# unpack.sh: put the env of this portable archive (written by `envbuilder backup ENV --portable`) at a new
# prefix, with no envbuilder: POSIX sh, tar, awk, and zstd or gzip for the payload.
#
#   mkdir t && tar -xf NAME.portable.tar -C t && sh t/unpack.sh /new/prefix
#
# The files that name the env's old prefix as text (script headers and activate scripts in bin/, pyvenv.cfg,
# .pth files, conda's activate.d/deactivate.d, envbuilder's activate extension; in a conda env every text file,
# as conda-unpack does) are listed in rewrite.txt when the archive was made; this script rewrites exactly those,
# never through a symlink. Files that name it in binary form are left (portable.json lists them).
set -eu

die() {
    printf 'unpack.sh: error: %s\n' "$1" >&2
    exit 1
}

[ "$#" -eq 1 ] || die "usage: sh unpack.sh NEW_PREFIX (a directory that does not exist yet, or is empty)"

case "$0" in
*/*) here=${0%/*} ;;
*) here=. ;;
esac
here=$(cd -P -- "$here" && pwd) || die "cannot find the directory that holds unpack.sh"

target=$1
case "$target" in
/*) ;;
"") die "NEW_PREFIX is empty" ;;
*) target=$(pwd)/$target ;;
esac
# Trailing slashes would end up in every rewritten path.
while :; do
    case "$target" in
    /) break ;;
    */) target=${target%/} ;;
    *) break ;;
    esac
done
[ "$target" != / ] || die "NEW_PREFIX cannot be /"

# The new prefix is written into shell scripts (inside their quotes), JSON and .pth files, and goes on PATH:
# only characters that need no escaping in any of them are accepted (a space is fine, a colon is not).
case "$target" in
*[!A-Za-z0-9/._+,@%=\ -]*)
    die "cannot put the env at '$target': its path holds a character this script cannot write safely into shell scripts, JSON and PATH (letters, digits, spaces and / . _ + , @ % = - only); choose another prefix"
    ;;
esac
case "$target" in
*/./* | */../* | */. | */..) die "NEW_PREFIX must not contain . or .. components: $target" ;;
esac

if [ -L "$target" ]; then
    die "$target is a symbolic link; name a directory that does not exist yet (nothing is written through a link)"
elif [ -e "$target" ]; then
    [ -d "$target" ] || die "$target exists and is not a directory"
    [ -z "$(ls -A -- "$target")" ] || die "$target exists and is not empty; nothing was changed (remove it, or name a new directory)"
fi

for f in payload.sha256 prefix.txt rewrite.txt links.txt; do
    [ -f "$here/$f" ] || die "$here/$f is missing: extract the whole archive (tar -xf NAME.portable.tar) next to unpack.sh"
done
payload=
for f in payload.tar.zst payload.tar.gz; do
    if [ -f "$here/$f" ]; then payload=$f; fi
done
[ -n "$payload" ] || die "no payload.tar.zst or payload.tar.gz beside unpack.sh: extract the whole archive"

if command -v sha256sum >/dev/null 2>&1; then
    check="sha256sum -c"
elif command -v shasum >/dev/null 2>&1; then
    check="shasum -a 256 -c" # macOS, BSDs
else
    check=
    printf 'unpack.sh: warning: neither sha256sum nor shasum is on PATH: the payload was not checked\n' >&2
fi
if [ -n "$check" ]; then
    (cd "$here" && $check payload.sha256) >/dev/null ||
        die "the archive's contents do not match their SHA256 (payload.sha256): it is damaged or incomplete; nothing was unpacked"
fi

case "$payload" in
*.zst)
    command -v zstd >/dev/null 2>&1 || die "the payload is zstd-compressed and zstd is not on PATH (load a zstd module)"
    decompress=zstd
    ;;
*) decompress=gzip ;;
esac

old=$(cat "$here/prefix.txt")
[ -n "$old" ] || die "prefix.txt is empty"

parent=${target%/*}
[ -n "$parent" ] || parent=/
mkdir -p -- "$parent" || die "cannot make $parent"
partial=$parent/.${target##*/}.unpack-$$
work=$partial.work # the rewrites' temporary files: a directory of this run's own, never one in the env
cleanup() {
    for made in "${partial:-}" "$work"; do
        if [ -n "$made" ] && [ -d "$made" ] && [ ! -L "$made" ]; then
            rm -rf -- "$made"
        fi
    done
}
trap cleanup EXIT
trap 'exit 130' INT TERM
mkdir -- "$partial" || die "cannot make $partial"
mkdir -- "$work" || die "cannot make $work"

printf 'unpacking into %s\n' "$target" >&2
"$decompress" -d -c -- "$here/$payload" | (cd "$partial" && tar -x -o -f -) ||
    die "extracting $payload failed"

# Rewrite OLD to NEW as a whole path (OLD/x, OLD followed by a quote, a space, : ; = ) ] or the end of the
# line: /a/env never matches inside /a/env2). A python script's #! line that the kernel cannot hold (a space in
# the path, or too long) becomes the /bin/sh trampoline pip and uv write in that case.
rewrite() {
    # Bytes, not characters: the files' encoding is not the locale's business.
    LC_ALL=C OLD=$old NEW=$target AWK_SCRIPT_HEADER=$2 awk -v trail="$3" '
function fix(s,    out, i, n, c) {
    out = ""
    n = length(old)
    while ((i = index(s, old)) > 0) {
        c = substr(s, i + n, 1)
        if (c == "" || index(bound, c) > 0) out = out substr(s, 1, i - 1) new
        else out = out substr(s, 1, i - 1 + n)
        s = substr(s, i + n)
    }
    return out s
}
function header(line,    rest, interp, args, sp, parts, n) {
    rest = substr(line, 3)
    sp = index(rest, " ")
    if (sp > 0) { interp = substr(rest, 1, sp - 1); args = substr(rest, sp) } else { interp = rest; args = "" }
    if (index(interp, old) != 1) return fix(line)
    interp = fix(interp)
    if (index(interp, " ") == 0 && length(interp args) + 2 <= 127) return "#!" interp args
    n = split(interp, parts, "/")
    if (parts[n] !~ /^python/) { bad = 1; return "#!" interp args }
    return "#!/bin/sh\n" q q q "exec" q " " q interp q args " \"$0\" \"$@\"\n" q " " q q q
}
BEGIN { q = sprintf("%c", 39); old = ENVIRON["OLD"]; new = ENVIRON["NEW"]; bound = "/ \t\"" q ":;=)]"; bad = 0 }
{
    line = (FNR == 1 && ENVIRON["AWK_SCRIPT_HEADER"] == "1" && substr($0, 1, 2) == "#!") ? header($0) : fix($0)
    if (NR > 1) printf "%s\n", prev
    prev = line
}
END {
    if (NR > 0) printf "%s%s", prev, (trail == "1" ? "\n" : "")
    exit bad ? 3 : 0
}' "$1"
}

# Never through a link: every directory on the way to an entry must be a real one.
real_dirs() { # (sh has no local variables: _dir and _left are this function's alone)
    _dir=$partial
    _left=$1
    while :; do
        case "$_left" in
        */*) _dir=$_dir/${_left%%/*}; _left=${_left#*/} ;;
        *) break ;;
        esac
        [ ! -L "$_dir" ] || die "$1: $_dir is a symbolic link in the archive; refusing to write through it"
    done
}

count=0
while IFS= read -r rel; do
    [ -n "$rel" ] || continue
    f=$partial/$rel
    real_dirs "$rel"
    [ -f "$f" ] && [ ! -L "$f" ] || die "$rel is listed for rewriting but is not a regular file"
    script=0
    case "$rel" in
    bin/*/*) ;;
    bin/*) script=1 ;;
    esac
    trail=1
    [ -z "$(tail -c 1 "$f")" ] || trail=0
    status=0
    rewrite "$f" "$script" "$trail" >"$work/file" || status=$?
    case "$status" in
    0) ;;
    3) printf 'unpack.sh: warning: %s: its #! line cannot name %s (not a python script); run it as INTERPRETER %s\n' "$rel" "$target" "$rel" >&2 ;;
    *) die "rewriting $rel failed" ;;
    esac
    cat "$work/file" >"$f" # keeps the file's mode
    count=$((count + 1))
done <"$here/rewrite.txt"

# Symbolic links whose target is an absolute path into the old prefix (links.txt: the link, then the rest of its
# target after the prefix, one a line): made again, pointing into the new prefix; the link itself is replaced,
# never what it points to.
links=0
while IFS= read -r rel && IFS= read -r rest; do
    real_dirs "$rel"
    [ -L "$partial/$rel" ] || die "$rel is listed as a symbolic link but is not one"
    rm -f -- "$partial/$rel"
    ln -s -- "$target$rest" "$partial/$rel" || die "cannot make the link $rel"
    links=$((links + 1))
done <"$here/links.txt"

if [ -d "$target" ] && [ ! -L "$target" ]; then
    rmdir -- "$target" 2>/dev/null || die "$target is no longer empty; nothing was changed there"
fi
# mv into an existing directory would move the env inside it: one that came meanwhile is refused.
if [ -e "$target" ] || [ -L "$target" ]; then
    die "$target appeared while unpacking; nothing was changed there"
fi
mv -- "$partial" "$target" || die "cannot rename $partial to $target"
partial=
printf 'unpacked the env at %s: %s file(s) and %s link(s) rewritten from %s\n' "$target" "$count" "$links" "$old" >&2
if [ -f "$target/pyvenv.cfg" ] && [ ! -e "$target/bin/python" ]; then
    printf "unpack.sh: warning: %s/bin/python points to a python this machine does not have (pyvenv.cfg's home); the env needs the same python at the same path\n" "$target" >&2
fi
printf 'activate it with: . "%s/bin/activate"\n' "$target" >&2
