package replay

import (
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/shizu-gpu/shizu/services/scheduler/placement"
)

// NodeSpec is one node of the trace's node file.
type NodeSpec struct {
	Name      string
	CPUMilli  int64
	MemoryMiB int64
	GPUs      int
	Model     string
}

// PodSpec is one task of the trace's pod file. GPUMilli is the milli-GPU
// per GPU (clamped to 1000, 0 for a CPU-only task); Models the allowed GPU
// models (empty: any). Created and Deleted are seconds; HasTimes is false
// for pod files without the time columns (the multigpu variants).
type PodSpec struct {
	Name      string
	CPUMilli  int64
	MemoryMiB int64
	GPUs      int
	GPUMilli  int64
	Models    []string
	Created   int64
	Deleted   int64
	HasTimes  bool
}

// GPURequest is k·d: the pod's total milli-GPU.
func (p *PodSpec) GPURequest() int64 { return int64(p.GPUs) * p.GPUMilli }

// Shape is the pod's key in the target workload.
func (p *PodSpec) Shape() placement.TaskShape {
	return placement.TaskShape{CPUMilli: p.CPUMilli, GPUs: p.GPUs, Milli: p.GPUMilli, Models: strings.Join(p.Models, "|")}
}

// Trace is a cluster and the tasks submitted to it.
type Trace struct {
	Nodes []NodeSpec
	Pods  []PodSpec
}

// CapacityMilli is the cluster's GPU capacity in milli-GPU.
func (t *Trace) CapacityMilli() int64 {
	var c int64
	for _, n := range t.Nodes {
		c += int64(n.GPUs) * placement.MilliPerGPU
	}
	return c
}

// columns maps the header's column names to indexes and checks the
// required ones.
func columns(header []string, required ...string) (map[string]int, error) {
	idx := map[string]int{}
	for i, h := range header {
		idx[strings.TrimSpace(h)] = i
	}
	var missing []string
	for _, r := range required {
		if _, ok := idx[r]; !ok {
			missing = append(missing, r)
		}
	}
	if len(missing) > 0 {
		return nil, fmt.Errorf("header %v lacks column(s) %v", header, missing)
	}
	return idx, nil
}

func parseInt(rec []string, idx map[string]int, col string, line int) (int64, error) {
	s := strings.TrimSpace(rec[idx[col]])
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("line %d: column %s: %q is not an integer", line, col, s)
	}
	if v < 0 {
		return 0, fmt.Errorf("line %d: column %s: %d is negative", line, col, v)
	}
	return v, nil
}

// ReadNodes parses a node CSV (sn,cpu_milli,memory_mib,gpu,model). Nodes
// without GPUs are kept; the paper's cluster is the GPU-node file.
func ReadNodes(r io.Reader) ([]NodeSpec, error) {
	cr := csv.NewReader(r)
	header, err := cr.Read()
	if err != nil {
		return nil, fmt.Errorf("node file: reading header: %w", err)
	}
	idx, err := columns(header, "sn", "cpu_milli", "memory_mib", "gpu", "model")
	if err != nil {
		return nil, fmt.Errorf("node file: %w", err)
	}
	var nodes []NodeSpec
	seen := map[string]bool{}
	for line := 2; ; line++ {
		rec, err := cr.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("node file: %w", err)
		}
		n := NodeSpec{Name: strings.TrimSpace(rec[idx["sn"]]), Model: strings.TrimSpace(rec[idx["model"]])}
		if n.Name == "" || seen[n.Name] {
			return nil, fmt.Errorf("node file: line %d: empty or duplicate name %q", line, n.Name)
		}
		seen[n.Name] = true
		if n.CPUMilli, err = parseInt(rec, idx, "cpu_milli", line); err != nil {
			return nil, fmt.Errorf("node file: %w", err)
		}
		if n.MemoryMiB, err = parseInt(rec, idx, "memory_mib", line); err != nil {
			return nil, fmt.Errorf("node file: %w", err)
		}
		g, err := parseInt(rec, idx, "gpu", line)
		if err != nil {
			return nil, fmt.Errorf("node file: %w", err)
		}
		if g > placement.MaxGPUsPerNode {
			return nil, fmt.Errorf("node file: line %d: %d GPUs is more than %d", line, g, placement.MaxGPUsPerNode)
		}
		n.GPUs = int(g)
		if n.GPUs > 0 && (n.Model == "" || n.Model == "nan") {
			return nil, fmt.Errorf("node file: line %d: node %s has GPUs but no model", line, n.Name)
		}
		nodes = append(nodes, n)
	}
	if len(nodes) == 0 {
		return nil, errors.New("node file: no nodes")
	}
	return nodes, nil
}

// ReadPods parses a pod CSV: name,cpu_milli,memory_mib,num_gpu,gpu_milli
// and optionally gpu_spec, creation_time, deletion_time (other columns are
// ignored). gpu_milli above 1000 is clamped to 1000 and whole-GPU tasks
// (num_gpu ≥ 2) take 1000 per GPU, as the simulator's converter does.
func ReadPods(r io.Reader) ([]PodSpec, error) {
	cr := csv.NewReader(r)
	cr.FieldsPerRecord = -1
	header, err := cr.Read()
	if err != nil {
		return nil, fmt.Errorf("pod file: reading header: %w", err)
	}
	idx, err := columns(header, "name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli")
	if err != nil {
		return nil, fmt.Errorf("pod file: %w", err)
	}
	_, hasSpec := idx["gpu_spec"]
	_, hasC := idx["creation_time"]
	_, hasD := idx["deletion_time"]
	var pods []PodSpec
	seen := map[string]bool{}
	for line := 2; ; line++ {
		rec, err := cr.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("pod file: %w", err)
		}
		if len(rec) != len(header) {
			return nil, fmt.Errorf("pod file: line %d: %d fields, header has %d", line, len(rec), len(header))
		}
		p := PodSpec{Name: strings.TrimSpace(rec[idx["name"]])}
		if p.Name == "" || seen[p.Name] {
			return nil, fmt.Errorf("pod file: line %d: empty or duplicate name %q", line, p.Name)
		}
		seen[p.Name] = true
		var k int64
		for _, f := range []struct {
			col string
			dst *int64
		}{{"cpu_milli", &p.CPUMilli}, {"memory_mib", &p.MemoryMiB}, {"num_gpu", &k}, {"gpu_milli", &p.GPUMilli}} {
			if *f.dst, err = parseInt(rec, idx, f.col, line); err != nil {
				return nil, fmt.Errorf("pod file: %w", err)
			}
		}
		if k > placement.MaxGPUsPerNode {
			return nil, fmt.Errorf("pod file: line %d: %d GPUs is more than %d", line, k, placement.MaxGPUsPerNode)
		}
		p.GPUs = int(k)
		switch {
		case p.GPUs == 0:
			p.GPUMilli = 0
		case p.GPUs > 1 || p.GPUMilli > placement.MilliPerGPU:
			p.GPUMilli = placement.MilliPerGPU
		case p.GPUMilli == 0:
			return nil, fmt.Errorf("pod file: line %d: pod %s asks for 1 GPU of 0 milli", line, p.Name)
		}
		if p.GPUs == 0 && p.CPUMilli == 0 {
			return nil, fmt.Errorf("pod file: line %d: pod %s asks for nothing", line, p.Name)
		}
		if hasSpec {
			if s := strings.TrimSpace(rec[idx["gpu_spec"]]); s != "" && s != "nan" {
				p.Models = strings.Split(s, "|")
			}
		}
		if hasC && hasD {
			p.HasTimes = true
			if p.Created, err = parseInt(rec, idx, "creation_time", line); err != nil {
				return nil, fmt.Errorf("pod file: %w", err)
			}
			if p.Deleted, err = parseInt(rec, idx, "deletion_time", line); err != nil {
				return nil, fmt.Errorf("pod file: %w", err)
			}
			if p.Deleted < p.Created {
				return nil, fmt.Errorf("pod file: line %d: pod %s deleted (%d) before created (%d)", line, p.Name, p.Deleted, p.Created)
			}
		}
		pods = append(pods, p)
	}
	if len(pods) == 0 {
		return nil, errors.New("pod file: no pods")
	}
	return pods, nil
}

// Load reads a node file and a pod file.
func Load(nodePath, podPath string) (Trace, error) {
	var t Trace
	f, err := os.Open(nodePath)
	if err != nil {
		return t, err
	}
	defer f.Close()
	if t.Nodes, err = ReadNodes(f); err != nil {
		return t, fmt.Errorf("%s: %w", nodePath, err)
	}
	g, err := os.Open(podPath)
	if err != nil {
		return t, err
	}
	defer g.Close()
	if t.Pods, err = ReadPods(g); err != nil {
		return t, fmt.Errorf("%s: %w", podPath, err)
	}
	return t, nil
}

// TraceDirName is the trace folder's path below a shared/ checkout.
const TraceDirName = "traces/alibaba-gpu-v2023"

// DefaultNodeFile and DefaultPodFile are the paper's cluster and default
// workload, relative to the trace folder.
const (
	DefaultNodeFile = "csv/openb_node_list_gpu_node.csv"
	DefaultPodFile  = "csv/openb_pod_list_default.csv"
)

// FindTraceDir looks for shared/traces/alibaba-gpu-v2023 from dir upwards:
// in dir/shared, dir/../shared (the repository's sibling, as /work/shared
// is to /work/main or shared/ beside a CI clone) and so on to the root; the
// environment variable SHIZU_TRACE_DIR wins when set. The error names every
// place looked at.
func FindTraceDir(dir string) (string, error) {
	if env := os.Getenv("SHIZU_TRACE_DIR"); env != "" {
		if st, err := os.Stat(env); err == nil && st.IsDir() {
			return env, nil
		}
		return "", fmt.Errorf("SHIZU_TRACE_DIR=%s is not a folder", env)
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return "", err
	}
	var tried []string
	for d := abs; ; d = filepath.Dir(d) {
		for _, c := range []string{filepath.Join(d, "shared", TraceDirName), filepath.Join(filepath.Dir(d), "shared", TraceDirName)} {
			if st, err := os.Stat(filepath.Join(c, DefaultNodeFile)); err == nil && !st.IsDir() {
				return c, nil
			}
			tried = append(tried, c)
		}
		if filepath.Dir(d) == d {
			break
		}
	}
	return "", fmt.Errorf("trace folder not found: expected the Alibaba GPU trace (file %s) in shared/%s beside the repository (e.g. /work/shared/%s for /work/main, or a sibling shared/ of the CI clone) or in SHIZU_TRACE_DIR; looked in %s",
		DefaultNodeFile, TraceDirName, TraceDirName, strings.Join(dedupe(tried), ", "))
}

func dedupe(s []string) []string {
	seen := map[string]bool{}
	var out []string
	for _, x := range s {
		if !seen[x] {
			seen[x] = true
			out = append(out, x)
		}
	}
	return out
}
