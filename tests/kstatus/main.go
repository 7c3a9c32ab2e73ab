// kstatus prints the verdict of sigs.k8s.io/cli-utils' kstatus library (the one Flux, kpt and
// cli-utils' own apply/wait use) for one Kubernetes object read as JSON from stdin:
//
//	kubectl get immortalcontainer x -o json | kstatus
//	{"status":"Current","message":"Resource is Ready"}
//
// Built by the end-to-end tests (tests/e2e/test_kstatus.py) into the project cache, never committed.
package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/cli-utils/pkg/kstatus/status"
)

type verdict struct {
	Status  string `json:"status"`
	Message string `json:"message"`
}

func main() {
	raw, err := io.ReadAll(os.Stdin)
	if err != nil {
		fail("reading stdin: %v", err)
	}
	// UnmarshalJSON keeps integers as int64 (encoding/json alone would make them float64, which
	// kstatus refuses for metadata.generation).
	obj := &unstructured.Unstructured{}
	if err := obj.UnmarshalJSON(raw); err != nil {
		fail("stdin is not a Kubernetes object in JSON: %v", err)
	}
	result, err := status.Compute(obj)
	if err != nil {
		fail("kstatus: %v", err)
	}
	out, _ := json.Marshal(verdict{Status: result.Status.String(), Message: result.Message})
	fmt.Println(string(out))
}

func fail(format string, args ...interface{}) {
	fmt.Fprintf(os.Stderr, "kstatus: "+format+"\n", args...)
	os.Exit(2)
}
