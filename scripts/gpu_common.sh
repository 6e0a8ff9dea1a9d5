# Sourced (not run) by the scripts/gpu_*.sh runs on a lent GPU node, after they set $out:
#   step NAME CMD...  runs CMD with its stdout and stderr in $out/NAME.out and $out/NAME.err, and prints its exit
#                     status and wall time (also appended to $out/steps.txt);
#   node_torch        sets node_env (the environment that holds the node's torch), torch_version (its release,
#                     without the build label) and variant (cuNNN from its CUDA version, or cpu).
step() {
  local name=$1 s=$EPOCHREALTIME
  shift
  "$@" > "$out/$name.out" 2> "$out/$name.err"
  echo "$name rc=$? wall=$(python3 -c "print(round($EPOCHREALTIME - $s, 2))")s" | tee -a "$out/steps.txt"
}

node_torch() {
  node_env=$(python3 -c 'import pathlib, torch; print(pathlib.Path(torch.__file__).parents[4])')
  torch_version=$(python3 -c 'import torch; print(torch.__version__.split("+")[0])')
  variant=$(python3 -c 'import torch; c = torch.version.cuda; print("cu" + c.replace(".", "") if c else "cpu")')
}
