package testenv

// The rich parameters and presets of the test stack's templates, shaped
// like those of Coder's kubernetes example: one of each kind coderd
// validates differently. The real Kubernetes template and the fast
// parameter-only template share them, so a test of parameter handling and
// one of a running workspace see the same rules.

// CoderProviderTF pins Coder's Terraform provider at the version `make
// tools` puts in the provider mirror.
const CoderProviderTF = `terraform {
  required_providers {
    coder = {
      source  = "coder/coder"
      version = "2.20.0"
    }
  }
}
`

// WorkspaceParametersTF declares:
//   - cpu: a number chosen from options (2, 4 or 8), mutable;
//   - memory: a number validated by coderd (1–16), mutable;
//   - home_disk_size: a number (1–100) that cannot change after create;
//   - greeting: a string a regex validates, mutable;
//   - debug: an ephemeral bool (set for one build only);
//
// and the presets "small" (2 cpu, 2 memory) and "large" (8 cpu, 16 memory).
const WorkspaceParametersTF = `data "coder_parameter" "cpu" {
  name         = "cpu"
  display_name = "CPU"
  description  = "The number of CPU cores"
  type         = "number"
  default      = "2"
  mutable      = true
  option {
    name  = "2 Cores"
    value = "2"
  }
  option {
    name  = "4 Cores"
    value = "4"
  }
  option {
    name  = "8 Cores"
    value = "8"
  }
}

data "coder_parameter" "memory" {
  name         = "memory"
  display_name = "Memory"
  description  = "The amount of memory in GB"
  type         = "number"
  default      = "2"
  mutable      = true
  validation {
    min = 1
    max = 16
  }
}

data "coder_parameter" "home_disk_size" {
  name         = "home_disk_size"
  display_name = "Home disk size"
  description  = "The size of the home disk in GB"
  type         = "number"
  default      = "10"
  mutable      = false
  validation {
    min = 1
    max = 100
  }
}

data "coder_parameter" "greeting" {
  name         = "greeting"
  display_name = "Greeting"
  description  = "What the workspace says when it starts"
  type         = "string"
  default      = "hello"
  mutable      = true
  validation {
    regex = "^[a-z ]+$"
    error = "Use lower-case letters and spaces only."
  }
}

data "coder_parameter" "debug" {
  name         = "debug"
  display_name = "Debug"
  description  = "Start this build with verbose logging"
  type         = "bool"
  default      = "false"
  mutable      = true
  ephemeral    = true
}

data "coder_workspace_preset" "small" {
  name = "small"
  parameters = {
    cpu    = "2"
    memory = "2"
  }
}

data "coder_workspace_preset" "large" {
  name = "large"
  parameters = {
    cpu    = "8"
    memory = "16"
  }
}
`

// ParameterTemplate returns a template with Coder's provider, the
// parameters and presets of WorkspaceParametersTF and no infrastructure:
// it imports and builds in seconds, for tests of parameter handling.
func ParameterTemplate() map[string]string {
	return map[string]string{
		"main.tf": CoderProviderTF + "\n" + WorkspaceParametersTF + `
data "coder_workspace" "me" {}

output "parameters" {
  value = {
    cpu            = data.coder_parameter.cpu.value
    memory         = data.coder_parameter.memory.value
    home_disk_size = data.coder_parameter.home_disk_size.value
    greeting       = data.coder_parameter.greeting.value
    debug          = data.coder_parameter.debug.value
  }
}
`,
	}
}
