package testenv

import "fmt"

// LogLinesTemplate returns a provider-free template whose start build
// writes lines numbered log lines ("log line N") to its build log, each
// pause seconds after the previous one (0: at once), then "the end": an
// OpenTofu terraform_data resource whose local-exec provisioner prints
// them. It builds offline, as ProviderFreeTemplate does; its stop builds
// print nothing.
func LogLinesTemplate(lines, pause int) map[string]string {
	return map[string]string{
		"main.tf": fmt.Sprintf(`# Build log lines for the log subresource's tests and benchmark.
resource "terraform_data" "log" {
  # A new resource on every start build, so that each prints the lines.
  triggers_replace = [timestamp()]
  provisioner "local-exec" {
    command = "i=1; while [ $i -le %d ]; do echo \"log line $i\"; if [ %d -gt 0 ]; then sleep %d; fi; i=$((i+1)); done; echo 'the end'"
  }
}
`, lines, pause, pause),
	}
}
