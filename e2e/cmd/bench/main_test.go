package main

import (
	"slices"
	"strings"
	"testing"
)

func TestKibs(t *testing.T) {
	tests := []struct {
		list string
		want []int // nil: an error
	}{
		{"2,16", []int{2 << 10, 16 << 10}},
		{" 512 ", []int{512 << 10}},
		{"", nil},
		{"0", nil},
		{"-2", nil},
		{"2k", nil},
		{"65537", nil},
	}
	for _, tt := range tests {
		got, err := kibs(tt.list)
		if tt.want == nil {
			if err == nil {
				t.Errorf("kibs(%q) = %v, want an error", tt.list, got)
			}
			continue
		}
		if err != nil || !slices.Equal(got, tt.want) {
			t.Errorf("kibs(%q) = %v, %v; want %v", tt.list, got, err, tt.want)
		}
	}
}

// TestQuickNamesItsWorkload: -quick runs b2b-saas alone, so it refuses a
// run that names another workload rather than file b2b-saas's figures
// under that name.
func TestQuickNamesItsWorkload(t *testing.T) {
	tests := []struct {
		workloads string
		refused   bool
	}{
		{"mixed", true},
		{"b2b-saas,mixed", true},
		{"b2b-saas", false},
		{"", false},
	}
	for _, tt := range tests {
		_, err := options(t.TempDir(), tt.workloads, "", true, "", "", "", "")
		// Past the check, options fails on the missing envoy.yaml: this
		// test does not run from the repository root.
		refused := err != nil && strings.Contains(err.Error(), "-quick")
		if refused != tt.refused {
			t.Errorf("-quick -workloads %q: error %v, want refused %v", tt.workloads, err, tt.refused)
		}
	}
}
