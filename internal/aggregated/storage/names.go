package storage

import (
	"fmt"
	"regexp"
	"strings"
)

// Coder names (organizations, users, workspaces) are letters, digits and
// single hyphens; template names may also use underscores. None contains a
// dot, and CoderControlPlane names are DNS-1035 labels, so dots separate
// the parts of an object name without ambiguity.
var (
	coderName     = regexp.MustCompile(`^[a-zA-Z0-9]+(?:-[a-zA-Z0-9]+)*$`)
	templateName  = regexp.MustCompile(`^[a-zA-Z0-9]+(?:[-_][a-zA-Z0-9]+)*$`)
	dns1035Label  = regexp.MustCompile(`^[a-z]([-a-z0-9]*[a-z0-9])?$`)
	maxCoderName  = 32
	maxTplName    = 32
	maxLabelBytes = 63
)

// workspaceName identifies a workspace: [controlPlane.]org.owner.name.
type workspaceName struct {
	ControlPlane string
	Org          string
	Owner        string
	Name         string
}

// String is the Kubernetes object name; the control plane prefix is
// written only when prefixed is true (the namespace has several).
func (n workspaceName) String(prefixed bool) string {
	s := n.Org + "." + n.Owner + "." + n.Name
	if prefixed {
		s = n.ControlPlane + "." + s
	}
	return s
}

// parseWorkspaceName reads an object name. The control plane is empty when
// the name has no prefix.
func parseWorkspaceName(s string) (workspaceName, error) {
	parts := strings.Split(s, ".")
	var n workspaceName
	switch len(parts) {
	case 3:
		n = workspaceName{Org: parts[0], Owner: parts[1], Name: parts[2]}
	case 4:
		n = workspaceName{ControlPlane: parts[0], Org: parts[1], Owner: parts[2], Name: parts[3]}
	default:
		return n, fmt.Errorf("a workspace name is <organization>.<owner>.<workspace>, or <control plane>.<organization>.<owner>.<workspace> when the namespace has several control planes; %q has %d parts", s, len(parts))
	}
	if len(parts) == 4 {
		if err := checkControlPlane(n.ControlPlane); err != nil {
			return n, err
		}
	}
	for _, p := range []struct{ what, v string }{{"organization", n.Org}, {"owner", n.Owner}, {"workspace", n.Name}} {
		if err := checkCoderName(p.what, p.v, coderName, maxCoderName, "letters, digits and single hyphens"); err != nil {
			return n, err
		}
	}
	return n, nil
}

// templateObjectName identifies a template: [controlPlane.]org.name.
type templateObjectName struct {
	ControlPlane string
	Org          string
	Name         string
}

func (n templateObjectName) String(prefixed bool) string {
	s := n.Org + "." + n.Name
	if prefixed {
		s = n.ControlPlane + "." + s
	}
	return s
}

func parseTemplateName(s string) (templateObjectName, error) {
	parts := strings.Split(s, ".")
	var n templateObjectName
	switch len(parts) {
	case 2:
		n = templateObjectName{Org: parts[0], Name: parts[1]}
	case 3:
		n = templateObjectName{ControlPlane: parts[0], Org: parts[1], Name: parts[2]}
	default:
		return n, fmt.Errorf("a template name is <organization>.<template>, or <control plane>.<organization>.<template> when the namespace has several control planes; %q has %d parts", s, len(parts))
	}
	if len(parts) == 3 {
		if err := checkControlPlane(n.ControlPlane); err != nil {
			return n, err
		}
	}
	if err := checkCoderName("organization", n.Org, coderName, maxCoderName, "letters, digits and single hyphens"); err != nil {
		return n, err
	}
	if err := checkCoderName("template", n.Name, templateName, maxTplName, "letters, digits and single hyphens or underscores"); err != nil {
		return n, err
	}
	return n, nil
}

func checkCoderName(what, v string, re *regexp.Regexp, max int, rule string) error {
	if v == "" {
		return fmt.Errorf("the %s part of the name is empty", what)
	}
	if len(v) > max || !re.MatchString(v) {
		return fmt.Errorf("%s name %q is not a valid Coder name (%s, at most %d characters)", what, v, rule, max)
	}
	return nil
}

func checkControlPlane(v string) error {
	if len(v) > maxLabelBytes || !dns1035Label.MatchString(v) {
		return fmt.Errorf("control plane %q is not a valid CoderControlPlane name", v)
	}
	return nil
}
