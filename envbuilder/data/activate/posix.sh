# envbuilder's activate templates for POSIX sh, which bash and zsh both run. Rendered by
# envbuilder/render/activate_scripts.py; never sourced as it is.
#
# Each "#@section NAME" line starts one template. @name@ is a value filled in already quoted for this shell; a
# line holding only @name@ takes a list of lines, each indented as the placeholder is (none: the line goes).
# Lines starting with "#%" are notes on the template and are left out of what is rendered.
#
# Plain POSIX sh: no word splitting on unquoted variables (zsh does not split them), colon lists walked with
# parameter expansion, every value quoted, variable names validated identifiers.

#@section extension
# envbuilder activate extension for @recipe@: sourced by bin/activate.
# Generated; envbuilder create rewrites it. deactivate undoes everything below.
#% Sourcing activate again: the venv redefines deactivate before calling it, so undo the previous run here.
if [ -n "${_ENVBUILDER_ACTIVE:-}" ] && type _envbuilder_undo >/dev/null 2>&1; then _envbuilder_undo; fi
_ENVBUILDER_ACTIVE=1
@saves@
@modules@
@conda@
@variables@
@paths@
#% After the recipe's variables: a value the recipe sets is kept and added to.
@constraints@
#% Modules may have put their own python first; the env's must win.
if [ -n "${@env_var@:-}" ]; then PATH="$@env_var@/bin:$PATH"; export PATH; fi
hash -r 2>/dev/null || true

_envbuilder_undo() {
    @path_drops@
    @conda_undo@
    @modules_undo@
    @path_finish@
    @restores@
    unset _ENVBUILDER_ACTIVE
}

@venv_deactivate@

#@section save
#% Saves a variable, or that it was unset, for deactivate.
if [ -n "${@var@+x}" ]; then _ENVBUILDER_OLD_@var@="${@var@}"; _ENVBUILDER_HAD_@var@=1; else _ENVBUILDER_HAD_@var@=0; fi

#@section restore
if [ "${_ENVBUILDER_HAD_@var@:-0}" = 1 ]; then @var@="$_ENVBUILDER_OLD_@var@"; export @var@; else unset @var@; fi
unset _ENVBUILDER_OLD_@var@ _ENVBUILDER_HAD_@var@

#@section set
@var@=@value@; export @var@

#@section unset
unset @var@

#@section path_save
#% A list variable activate adds to: only whether it was set is kept (deactivate takes out its own entries).
if [ -n "${@var@+x}" ]; then _ENVBUILDER_HAD_@var@=1; else _ENVBUILDER_HAD_@var@=0; fi

#@section prepend
#% No empty entry where the value was empty or unset: to the loader and the shell that is the current directory.
@var@=@entries@"${@var@:+:$@var@}"; export @var@

#@section append
@var@="${@var@:+$@var@:}"@entries@; export @var@

#@section path_drop_function
#% _envbuilder_path_drop VAR ENTRY first|last: takes one ENTRY out of the colon list in VAR (the first one for a
#% prepended entry, the last for an appended one) and leaves every other entry, empty ones included, in order.
#% VAR is a validated identifier, so eval only ever reads and assigns that variable.
_envbuilder_path_drop() {
    eval "_envbuilder_value=\${$1-}"
    _envbuilder_count=0
    _envbuilder_rest="$_envbuilder_value:"
    while [ -n "$_envbuilder_rest" ]; do
        _envbuilder_item=${_envbuilder_rest%%:*}
        _envbuilder_rest=${_envbuilder_rest#*:}
        if [ "$_envbuilder_item" = "$2" ]; then _envbuilder_count=$((_envbuilder_count + 1)); fi
    done
    if [ "$_envbuilder_count" -gt 0 ]; then
        if [ "$3" = first ]; then _envbuilder_target=1; else _envbuilder_target=$_envbuilder_count; fi
        _envbuilder_kept=""
        _envbuilder_seen=0
        _envbuilder_first=1
        _envbuilder_rest="$_envbuilder_value:"
        while [ -n "$_envbuilder_rest" ]; do
            _envbuilder_item=${_envbuilder_rest%%:*}
            _envbuilder_rest=${_envbuilder_rest#*:}
            if [ "$_envbuilder_item" = "$2" ]; then
                _envbuilder_seen=$((_envbuilder_seen + 1))
                if [ "$_envbuilder_seen" = "$_envbuilder_target" ]; then continue; fi
            fi
            if [ "$_envbuilder_first" = 1 ]; then
                _envbuilder_kept=$_envbuilder_item
                _envbuilder_first=0
            else
                _envbuilder_kept="$_envbuilder_kept:$_envbuilder_item"
            fi
        done
        eval "$1=\$_envbuilder_kept"
    fi
    unset _envbuilder_value _envbuilder_count _envbuilder_rest _envbuilder_item _envbuilder_target
    unset _envbuilder_kept _envbuilder_seen _envbuilder_first
}

#@section path_drop_forget
unset -f _envbuilder_path_drop

#@section path_drop
_envbuilder_path_drop @var@ @entry@ @which@

#@section path_finish
#% After the modules are unloaded (they may have added to the same variable): unset again what was unset before
#% activate and holds nothing now; otherwise keep what is left, the user's own additions included.
if [ "${_ENVBUILDER_HAD_@var@:-0}" = 0 ] && [ -z "${@var@:-}" ]; then unset @var@; elif [ -n "${@var@+x}" ]; then export @var@; fi
unset _ENVBUILDER_HAD_@var@

#@section state_names
#% Names of the module systems' bookkeeping variables in the environment, colon-separated (Lmod and Tcl modules).
env | grep -oE '^(_ModuleTable[A-Za-z0-9_]*|__LMOD_REF_COUNT_[A-Za-z0-9_]*|__MODULES_[A-Za-z0-9_]*|_LMFILES_|LOADEDMODULES)=' | tr -d '=' | tr '\n' ':'

#@section modules
#% Records which modules and `module use` paths were there before, so deactivate undoes exactly what this added.
#% The module system's init for *this* shell, where the user's shell has no module function yet.
if [ -n "${ZSH_VERSION:-}" ]; then _envbuilder_shell=zsh; else _envbuilder_shell=bash; fi
if ! type module >/dev/null 2>&1 && [ -f @init_dir@/"$_envbuilder_shell" ]; then . @init_dir@/"$_envbuilder_shell"; fi
unset _envbuilder_shell
_ENVBUILDER_MODULES_BEFORE=":${LOADEDMODULES:-}:"
#% Module-system bookkeeping variables present now; deactivate removes any that activation added.
_ENVBUILDER_STATE_BEFORE=":$(@state_names@):"
_ENVBUILDER_USED=""
if type module >/dev/null 2>&1; then
    @uses@
    @load@
else
    echo "envbuilder: no module command here; the env's modules are not loaded" >&2
fi
#% Modules this activation added (dependencies included), newest first, for deactivate.
_ENVBUILDER_ADDED=""
_envbuilder_rest="${LOADEDMODULES:-}:"
while [ -n "$_envbuilder_rest" ]; do
    _envbuilder_item=${_envbuilder_rest%%:*}
    _envbuilder_rest=${_envbuilder_rest#*:}
    [ -n "$_envbuilder_item" ] || continue
    case "$_ENVBUILDER_MODULES_BEFORE" in *":$_envbuilder_item:"*) ;; *) _ENVBUILDER_ADDED="$_envbuilder_item:$_ENVBUILDER_ADDED" ;; esac
done
unset _ENVBUILDER_MODULES_BEFORE _envbuilder_rest _envbuilder_item

#@section module_use
case ":${MODULEPATH:-}:" in *:@path@:*) ;; *) module use @path@ && _ENVBUILDER_USED="@path_dq@:$_ENVBUILDER_USED" ;; esac

#@section module_load
module load @modules@ || echo "envbuilder: module load @modules_dq@ failed; see module spider" >&2

#@section conda_env
#% ALCF's `module load conda; conda activate`: the `conda` shell function comes from a module just loaded. Where
#% there is none, or conda activate fails, this activation takes back what it did so far (the modules, the venv's
#% own activate through its deactivate) and sourcing returns 1: nothing is left half applied.
if type conda >/dev/null 2>&1; then
    if conda activate @conda_env@; then
        _ENVBUILDER_CONDA_SHLVL="${CONDA_SHLVL:-}"
    else
        echo "envbuilder: conda activate @conda_env_dq@ failed (activate.conda_env); the env is not activated" >&2
        _envbuilder_abort=1
    fi
else
    echo "envbuilder: no conda command once the modules are loaded, so conda activate @conda_env_dq@ (activate.conda_env) cannot run; the env is not activated" >&2
    _envbuilder_abort=1
fi
if [ -n "${_envbuilder_abort:-}" ]; then
    unset _envbuilder_abort
    @modules_undo@
    @path_finish@
    @restores@
    unset _ENVBUILDER_ACTIVE
    if type deactivate >/dev/null 2>&1; then deactivate; fi
    return 1
fi

#@section conda_env_undo
#% Only while the env activate entered is still conda's innermost: one the user activated on top is theirs.
if [ -n "${_ENVBUILDER_CONDA_SHLVL+x}" ]; then
    if [ "${CONDA_SHLVL:-}" = "$_ENVBUILDER_CONDA_SHLVL" ] && type conda >/dev/null 2>&1; then
        conda deactivate
    else
        echo "envbuilder: another conda env is active on top of @conda_env_dq@; leaving conda's envs as they are (conda deactivate)" >&2
    fi
    unset _ENVBUILDER_CONDA_SHLVL
fi

#@section modules_undo
#% Unloads the modules activation added (newest first) and unuses its paths, then drops bookkeeping variables
#% the module system left behind.
if type module >/dev/null 2>&1; then
    _envbuilder_rest="${_ENVBUILDER_ADDED:-}:"
    while [ -n "$_envbuilder_rest" ]; do
        _envbuilder_item=${_envbuilder_rest%%:*}
        _envbuilder_rest=${_envbuilder_rest#*:}
        [ -n "$_envbuilder_item" ] || continue
        module unload "$_envbuilder_item"
    done
    _envbuilder_rest="${_ENVBUILDER_USED:-}:"
    while [ -n "$_envbuilder_rest" ]; do
        _envbuilder_item=${_envbuilder_rest%%:*}
        _envbuilder_rest=${_envbuilder_rest#*:}
        [ -n "$_envbuilder_item" ] || continue
        module unuse "$_envbuilder_item"
    done
fi
_ENVBUILDER_STATE_NOW="$(@state_names@)"
_envbuilder_rest="${_ENVBUILDER_STATE_NOW:-}:"
while [ -n "$_envbuilder_rest" ]; do
    _envbuilder_item=${_envbuilder_rest%%:*}
    _envbuilder_rest=${_envbuilder_rest#*:}
    [ -n "$_envbuilder_item" ] || continue
    case "$_ENVBUILDER_STATE_BEFORE" in *":$_envbuilder_item:"*) ;; *) unset "$_envbuilder_item" ;; esac
done
unset _ENVBUILDER_ADDED _ENVBUILDER_USED _ENVBUILDER_STATE_BEFORE _ENVBUILDER_STATE_NOW
unset _envbuilder_rest _envbuilder_item

#@section constraints
#% Appends the env's constraints file to pip's and uv's lists (pip splits the value of a list option on
#% whitespace, uv on spaces), so a later `pip install X` cannot replace the env's torch build. A prefix holding
#% whitespace would read as several files: then nothing is exported (a broken list would make every pip run
#% fail) and one line says torch is unguarded.
if [ -f "$@env_var@/@constraints@" ]; then
    case "$@env_var@" in
        *[[:space:]]*) printf '%s\n' 'envbuilder: pip install and uv pip install in this env are not kept from replacing its torch: PIP_CONSTRAINT and UV_CONSTRAINT are whitespace-separated lists and the env path holds whitespace (pass --constraint "$@env_var@/@constraints@" yourself)' >&2 ;;
        *)
            @exports@
            ;;
    esac
fi

#@section constraint
@var@="${@var@:+$@var@ }$@env_var@/@constraints@"; export @var@

#@section venv_deactivate
#% Wraps the venv's deactivate (whatever its body) so one call undoes both, in bash and zsh alike.
if type deactivate >/dev/null 2>&1; then
    eval "$(typeset -f deactivate | sed '1s/^deactivate/_envbuilder_venv_deactivate/')"
    deactivate() {
        _envbuilder_undo
        _envbuilder_venv_deactivate "$@"
        if [ "${1:-}" != nondestructive ]; then unset -f _envbuilder_venv_deactivate _envbuilder_undo; fi
    }
fi

#@section hook
@begin@
# Loads the recipe's modules and variables; deactivate undoes them. Rewritten by envbuilder create.
#% $VIRTUAL_ENV is set by every activate (venv, virtualenv, uv) before its end; expanded in double quotes it is
#% safe whatever the prefix holds.
if [ -f "$VIRTUAL_ENV/@extension@" ]; then . "$VIRTUAL_ENV/@extension@"; fi
@end@

#@section user_prefix
# envbuilder activate for a user-prefix env: source it from bash or zsh.
if [ -n "${_ENVBUILDER_USERBASE_ACTIVE:-}" ] && type deactivate >/dev/null 2>&1; then deactivate; fi
_ENVBUILDER_USERBASE_ACTIVE=1
@saves@
PYTHONUSERBASE=@prefix@; export PYTHONUSERBASE
PATH="$PYTHONUSERBASE/bin:$PATH"; export PATH
hash -r 2>/dev/null || true
deactivate() {
    @restores@
    unset _ENVBUILDER_USERBASE_ACTIVE
    hash -r 2>/dev/null || true
    if [ "${1:-}" != nondestructive ]; then unset -f deactivate; fi
}
if [ -f @extension@ ]; then . @extension@; fi

#@section conda_activate
# envbuilder activate for a conda env: source it from bash or zsh (conda activate works as well).
if [ -n "${_ENVBUILDER_CONDA_ACTIVE:-}" ] && type deactivate >/dev/null 2>&1; then deactivate; fi
_ENVBUILDER_CONDA_ACTIVE=1
@saves@
CONDA_PREFIX=@prefix@; export CONDA_PREFIX
CONDA_DEFAULT_ENV=@prefix@; export CONDA_DEFAULT_ENV
PATH="$CONDA_PREFIX/bin:$PATH"; export PATH
for _envbuilder_hook in "$CONDA_PREFIX"/etc/conda/activate.d/*.sh; do
    if [ -f "$_envbuilder_hook" ]; then . "$_envbuilder_hook"; fi
done
unset _envbuilder_hook
hash -r 2>/dev/null || true
deactivate() {
    for _envbuilder_hook in "$CONDA_PREFIX"/etc/conda/deactivate.d/*.sh; do
        if [ -f "$_envbuilder_hook" ]; then . "$_envbuilder_hook"; fi
    done
    unset _envbuilder_hook
    @restores@
    unset _ENVBUILDER_CONDA_ACTIVE
    hash -r 2>/dev/null || true
    if [ "${1:-}" != nondestructive ]; then unset -f deactivate; fi
}

#@section conda_deactivate
# envbuilder: undo what etc/conda/activate.d/envbuilder.sh did (modules, variables). Generated.
if type _envbuilder_undo >/dev/null 2>&1; then _envbuilder_undo; unset -f _envbuilder_undo; fi

#@section image
# envbuilder: activates an env from its image (@how@); written by envbuilder activate --image.
#% The image is read-only, so this wrapper lives beside the mount: it sources the env's own activate, then wraps
#% that deactivate (the venv's, with envbuilder's extension) so one call undoes both and unmounts the image.
. @path@/bin/activate || return 1
if type deactivate >/dev/null 2>&1; then
    eval "$(typeset -f deactivate | sed '1s/^deactivate/_envbuilder_image_deactivate/')"
    deactivate() {
        _envbuilder_image_deactivate "$@"
        if [ "${1:-}" != nondestructive ]; then
            unset -f _envbuilder_image_deactivate
            @unmount@
        fi
    }
fi

#@section image_unmount
#% A shell still inside the mount keeps it busy: then it stays, and the message says how to unmount it later.
@fusermount@ -u @path@ 2>/dev/null || echo "envbuilder: @path_dq@ is still in use; unmount it later: @fusermount_dq@ -u @path_dq@" >&2
