# envbuilder's activate templates for fish. Rendered by envbuilder/activate_scripts.py; never sourced as it is.
#
# Same layout as posix.sh: "#@section NAME" starts a template, @name@ is a value already quoted for fish, a line
# holding only @name@ takes lines, "#%" lines are notes. fish splits variables named *PATH on colons, so list
# variables are handled as their colon-joined text.

#@section extension
# envbuilder activate extension for @recipe@: sourced by bin/activate.fish.
# Generated; envbuilder create rewrites it. deactivate undoes everything below.
#% Sourcing activate.fish again: the venv redefines deactivate before calling it, so undo the previous run here.
if set -q _ENVBUILDER_ACTIVE; and functions -q _envbuilder_undo; _envbuilder_undo; end
set -g _ENVBUILDER_ACTIVE 1
@saves@
@modules@
@conda@
@variables@
@paths@
@constraints@
#% Modules may have put their own python first; the env's must win.
if test -n "$@env_var@"; set -gx PATH "$@env_var@/bin" $PATH; end

function _envbuilder_undo
    @path_drops@
    @modules_undo@
    @path_finish@
    @restores@
    set -e _ENVBUILDER_ACTIVE
end

@venv_deactivate@

#@section save
if set -q @var@; set -g _ENVBUILDER_OLD_@var@ $@var@; set -g _ENVBUILDER_HAD_@var@ 1; else; set -g _ENVBUILDER_HAD_@var@ 0; end

#@section restore
if test "$_ENVBUILDER_HAD_@var@" = 1; set -gx @var@ $_ENVBUILDER_OLD_@var@; else; set -e @var@; end
set -e _ENVBUILDER_OLD_@var@
set -e _ENVBUILDER_HAD_@var@

#@section set
set -gx @var@ @value@

#@section unset
set -e @var@

#@section path_save
if set -q @var@; set -g _ENVBUILDER_HAD_@var@ 1; else; set -g _ENVBUILDER_HAD_@var@ 0; end

#@section prepend
#% No empty entry where the value was empty or unset: to the loader and the shell that is the current directory.
set -g _envbuilder_value (string join : -- $@var@)
if test -n "$_envbuilder_value"; set -gx @var@ @entries@:"$_envbuilder_value"; else; set -gx @var@ @entries@; end
set -e _envbuilder_value

#@section append
set -g _envbuilder_value (string join : -- $@var@)
if test -n "$_envbuilder_value"; set -gx @var@ "$_envbuilder_value":@entries@; else; set -gx @var@ @entries@; end
set -e _envbuilder_value

#@section path_drop_function
#% _envbuilder_path_drop VAR ENTRY first|last: takes one ENTRY out of the colon list in VAR (the first one for a
#% prepended entry, the last for an appended one) and leaves every other entry, empty ones included, in order.
function _envbuilder_path_drop
    set -q $argv[1]; or return 0
    set -l items (string split : -- (string join : -- $$argv[1]))
    set -l target 0
    for i in (seq (count $items))
        if test "x$items[$i]" = "x$argv[2]"
            set target $i
            test "$argv[3]" = first; and break
        end
    end
    test $target -gt 0; or return 0
    set -e items[$target]
    set -gx $argv[1] (string join : -- $items)
end

#@section path_drop_forget
functions -e _envbuilder_path_drop

#@section path_drop
_envbuilder_path_drop @var@ @entry@ @which@

#@section path_finish
#% After the modules are unloaded: unset again what was unset before activate and holds nothing now.
set -l _envbuilder_value (string join : -- $@var@)
if test "$_ENVBUILDER_HAD_@var@" = 0; and test -z "$_envbuilder_value"; set -e @var@; end
set -e _ENVBUILDER_HAD_@var@

#@section state_names
#% Names of the module systems' bookkeeping variables in the environment (Lmod and Tcl modules).
env | string match -r -- '^(?:_ModuleTable[A-Za-z0-9_]*|__LMOD_REF_COUNT_[A-Za-z0-9_]*|__MODULES_[A-Za-z0-9_]*|_LMFILES_|LOADEDMODULES)(?==)'

#@section modules
#% The module system's init for fish, where the user's shell has no module function yet.
if not functions -q module; and test -f @init_dir@/fish; source @init_dir@/fish; end
set -g _ENVBUILDER_MODULES_BEFORE (string split : -- "$LOADEDMODULES")
set -g _ENVBUILDER_STATE_BEFORE (@state_names@)
set -g _ENVBUILDER_USED
if functions -q module
    @uses@
    @load@
else
    echo "envbuilder: no module command here; the env's modules are not loaded" >&2
end
#% Modules this activation added (dependencies included), newest first, for deactivate.
set -g _ENVBUILDER_ADDED
for _envbuilder_item in (string split : -- "$LOADEDMODULES")
    if test -n "$_envbuilder_item"; and not contains -- $_envbuilder_item $_ENVBUILDER_MODULES_BEFORE
        set -g _ENVBUILDER_ADDED $_envbuilder_item $_ENVBUILDER_ADDED
    end
end
set -e _ENVBUILDER_MODULES_BEFORE
set -e _envbuilder_item

#@section module_use
#% Lmod's fish `module` evals its arguments: each path goes in escaped for that.
if not contains -- @path@ $MODULEPATH; module use (string escape -- @path@); and set -g _ENVBUILDER_USED @path@ $_ENVBUILDER_USED; end

#@section module_load
module load @modules@; or echo "envbuilder: module load @modules_dq@ failed; see module spider" >&2

#@section conda_env
echo "envbuilder: conda activate @conda_env_dq@ (activate.conda_env) runs from bash and zsh only; run it yourself" >&2

#@section modules_undo
if functions -q module
    for _envbuilder_item in $_ENVBUILDER_ADDED
        module unload $_envbuilder_item
    end
    for _envbuilder_item in $_ENVBUILDER_USED
        module unuse (string escape -- $_envbuilder_item)
    end
end
for _envbuilder_item in (@state_names@)
    contains -- $_envbuilder_item $_ENVBUILDER_STATE_BEFORE; or set -e $_envbuilder_item
end
set -e _ENVBUILDER_ADDED
set -e _ENVBUILDER_USED
set -e _ENVBUILDER_STATE_BEFORE

#@section constraints
#% As posix.sh: a prefix holding whitespace would read as several files, so then nothing is exported.
if test -f "$@env_var@/@constraints@"
    if string match -qr '\s' -- "$@env_var@"
        printf '%s\n' 'envbuilder: pip install and uv pip install in this env are not kept from replacing its torch: PIP_CONSTRAINT and UV_CONSTRAINT are whitespace-separated lists and the env path holds whitespace (pass --constraint "$@env_var@/@constraints@" yourself)' >&2
    else
        @exports@
    end
end

#@section constraint
if test -n "$@var@"; set -gx @var@ "$@var@ $@env_var@/@constraints@"; else; set -gx @var@ "$@env_var@/@constraints@"; end

#@section venv_deactivate
#% Wraps the venv's deactivate so one call undoes both.
if functions -q deactivate
    functions -e _envbuilder_venv_deactivate
    functions -c deactivate _envbuilder_venv_deactivate
    function deactivate -d 'Undo the envbuilder extension, then the venv'
        _envbuilder_undo
        _envbuilder_venv_deactivate $argv
        if test "$argv[1]" != nondestructive; functions -e _envbuilder_venv_deactivate _envbuilder_undo; end
    end
end

#@section hook
@begin@
# Loads the recipe's modules and variables; deactivate undoes them. Rewritten by envbuilder create.
if test -f "$VIRTUAL_ENV/@extension@"; source "$VIRTUAL_ENV/@extension@"; end
@end@

#@section user_prefix
# envbuilder activate for a user-prefix env: source it from fish; deactivate undoes it.
if set -q _ENVBUILDER_USERBASE_ACTIVE; and functions -q deactivate; deactivate; end
set -g _ENVBUILDER_USERBASE_ACTIVE 1
@saves@
set -gx PYTHONUSERBASE @prefix@
set -gx PATH "$PYTHONUSERBASE/bin" $PATH
function deactivate -d 'Undo the user-prefix env activation'
    @restores@
    set -e _ENVBUILDER_USERBASE_ACTIVE
    if test "$argv[1]" != nondestructive; functions -e deactivate; end
end
#% The extension wraps this deactivate, as it wraps a venv's.
if test -f @extension@; source @extension@; end

#@section conda_activate
# envbuilder activate for a conda env: source it from fish (conda activate works as well).
#% What conda activate does for one env, then the env's activate.d/*.fish, as conda's fish activator runs them.
if set -q _ENVBUILDER_CONDA_ACTIVE; and functions -q deactivate; deactivate; end
set -g _ENVBUILDER_CONDA_ACTIVE 1
@saves@
set -gx CONDA_PREFIX @prefix@
set -gx CONDA_DEFAULT_ENV @prefix@
set -gx PATH "$CONDA_PREFIX/bin" $PATH
#% A glob matching nothing gives a for loop no items (no error).
for _envbuilder_hook in "$CONDA_PREFIX"/etc/conda/activate.d/*.fish
    source $_envbuilder_hook
end
set -e _envbuilder_hook
function deactivate -d 'Undo the conda env activation'
    for _envbuilder_hook in "$CONDA_PREFIX"/etc/conda/deactivate.d/*.fish
        source $_envbuilder_hook
    end
    set -e _envbuilder_hook
    @restores@
    set -e _ENVBUILDER_CONDA_ACTIVE
    if test "$argv[1]" != nondestructive; functions -e deactivate; end
end

#@section conda_deactivate
# envbuilder: undo what etc/conda/activate.d/envbuilder.fish did (modules, variables). Generated.
if functions -q _envbuilder_undo; _envbuilder_undo; functions -e _envbuilder_undo; end

#@section image
# envbuilder: activates an env from its image (@how@); written by envbuilder activate --image.
#% As posix.sh: the env's own activate.fish (relocatable: it finds the mount itself), its deactivate wrapped so
#% one call undoes both and unmounts the image.
source @path@/bin/activate.fish; or return 1
if functions -q deactivate
    functions -e _envbuilder_image_deactivate
    functions -c deactivate _envbuilder_image_deactivate
    function deactivate -d 'Undo the activation, then unmount the image'
        _envbuilder_image_deactivate $argv
        if test "$argv[1]" != nondestructive
            functions -e _envbuilder_image_deactivate
            @unmount@
        end
    end
end

#@section image_unmount
#% A shell still inside the mount keeps it busy: then it stays, and the message says how to unmount it later.
@fusermount@ -u @path@ 2>/dev/null; or echo "envbuilder: @path_dq@ is still in use; unmount it later: @fusermount_dq@ -u @path_dq@" >&2
