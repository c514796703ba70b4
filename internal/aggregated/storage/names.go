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
	coderName    = regexp.MustCompile(`^[a-zA-Z0-9]+(?:-[a-zA-Z0-9]+)*$`)
	templateName = regexp.MustCompile(`^[a-zA-Z0-9]+(?:[-_][a-zA-Z0-9]+)*$`)
	dns1035Label = regexp.MustCompile(`^[a-z]([-a-z0-9]*[a-z0-9])?$`)
	maxCoderName = 32
	maxTplName   = 32
	// Template version names may also contain dots (codersdk's
	// TemplateVersionNameValid).
	versionName    = regexp.MustCompile(`^[a-zA-Z0-9]+(?:[_.-][a-zA-Z0-9]+)*$`)
	maxVersionName = 64
	maxLabelBytes  = 63
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
	return joinName(prefixed, n.ControlPlane, n.Org, n.Owner, n.Name)
}

// parseWorkspaceName reads an object name. The control plane is empty when
// the name has no prefix.
func parseWorkspaceName(s string) (workspaceName, error) {
	cp, parts, err := splitName(s, 3, "a workspace name is <organization>.<owner>.<workspace>, or <control plane>.<organization>.<owner>.<workspace> when the namespace has several control planes")
	var n workspaceName
	if parts != nil {
		n = workspaceName{ControlPlane: cp, Org: parts[0], Owner: parts[1], Name: parts[2]}
	}
	if err != nil {
		return n, err
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
	return joinName(prefixed, n.ControlPlane, n.Org, n.Name)
}

func parseTemplateName(s string) (templateObjectName, error) {
	cp, parts, err := splitName(s, 2, "a template name is <organization>.<template>, or <control plane>.<organization>.<template> when the namespace has several control planes")
	var n templateObjectName
	if parts != nil {
		n = templateObjectName{ControlPlane: cp, Org: parts[0], Name: parts[1]}
	}
	if err != nil {
		return n, err
	}
	return n, checkTemplateParts(n.Org, n.Name)
}

// checkTemplateParts checks the organization and template parts of a
// template's or a template version's name.
func checkTemplateParts(org, tpl string) error {
	if err := checkCoderName("organization", org, coderName, maxCoderName, "letters, digits and single hyphens"); err != nil {
		return err
	}
	return checkCoderName("template", tpl, templateName, maxTplName, "letters, digits and single hyphens or underscores")
}

// joinName writes an object name from its Coder parts, behind the control
// plane when prefixed.
func joinName(prefixed bool, controlPlane string, parts ...string) string {
	s := strings.Join(parts, ".")
	if prefixed {
		s = controlPlane + "." + s
	}
	return s
}

// splitName reads an object name of n Coder parts, with or without a
// control plane in front (which must then be a CoderControlPlane name).
// Another number of parts is an error that starts with format, the
// name's rule; parts is nil then.
func splitName(s string, n int, format string) (controlPlane string, parts []string, err error) {
	parts = strings.Split(s, ".")
	switch len(parts) {
	case n:
		return "", parts, nil
	case n + 1:
		return parts[0], parts[1:], checkControlPlane(parts[0])
	}
	return "", nil, fmt.Errorf("%s; %q has %d parts", format, s, len(parts))
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

// templateVersionName identifies a template version:
// [controlPlane.]org.template.version.
type templateVersionName struct {
	ControlPlane string
	Org          string
	Template     string
	Version      string
}

func (n templateVersionName) String(prefixed bool) string {
	return joinName(prefixed, n.ControlPlane, n.Org, n.Template, n.Version)
}

// parseTemplateVersionName reads an object name of a namespace whose
// names carry the control plane prefix when prefixed (it has several).
// Version names may contain dots, so the parts after the template are the
// version's, and only the namespace can say whether the first part is a
// control plane: cp.org.tpl.v1 and org.tpl.v1.2 look alike.
func parseTemplateVersionName(s string, prefixed bool) (templateVersionName, error) {
	const format = "a template version name is <organization>.<template>.<version>, or <control plane>.<organization>.<template>.<version> when the namespace has several control planes"
	parts := strings.Split(s, ".")
	var n templateVersionName
	if prefixed {
		if len(parts) < 4 {
			return n, fmt.Errorf("%s; the namespace has several control planes, and %q has %d parts", format, s, len(parts))
		}
		n.ControlPlane, parts = parts[0], parts[1:]
		if err := checkControlPlane(n.ControlPlane); err != nil {
			return n, err
		}
	}
	if len(parts) < 3 {
		return n, fmt.Errorf("%s; %q has %d parts", format, s, len(parts))
	}
	n.Org, n.Template, n.Version = parts[0], parts[1], strings.Join(parts[2:], ".")
	if err := checkTemplateParts(n.Org, n.Template); err != nil {
		return n, err
	}
	if err := checkCoderName("version", n.Version, versionName, maxVersionName, "letters and digits separated by single hyphens, underscores or dots"); err != nil {
		return n, err
	}
	return n, nil
}

// Group names follow usernames' rule but may be longer, to match an
// identity provider's (codersdk.GroupNameValid).
const maxGroupName = 255

// groupObjectName identifies a group: [controlPlane.]org.group.
type groupObjectName struct {
	ControlPlane string
	Org          string
	Name         string
}

func (n groupObjectName) String(prefixed bool) string {
	return joinName(prefixed, n.ControlPlane, n.Org, n.Name)
}

func parseGroupName(s string) (groupObjectName, error) {
	cp, parts, err := splitName(s, 2, "a group name is <organization>.<group>, or <control plane>.<organization>.<group> when the namespace has several control planes")
	var n groupObjectName
	if parts != nil {
		n = groupObjectName{ControlPlane: cp, Org: parts[0], Name: parts[1]}
	}
	if err != nil {
		return n, err
	}
	if err := checkCoderName("organization", n.Org, coderName, maxCoderName, "letters, digits and single hyphens"); err != nil {
		return n, err
	}
	return n, checkCoderName("group", n.Name, coderName, maxGroupName, "letters, digits and single hyphens")
}

// orgObjectName identifies an organization: [controlPlane.]org.
type orgObjectName struct {
	ControlPlane string
	Org          string
}

func (n orgObjectName) String(prefixed bool) string {
	return joinName(prefixed, n.ControlPlane, n.Org)
}

func parseOrgName(s string) (orgObjectName, error) {
	cp, parts, err := splitName(s, 1, "an organization name is <organization>, or <control plane>.<organization> when the namespace has several control planes")
	var n orgObjectName
	if parts != nil {
		n = orgObjectName{ControlPlane: cp, Org: parts[0]}
	}
	if err != nil {
		return n, err
	}
	return n, checkCoderName("organization", n.Org, coderName, maxCoderName, "letters, digits and single hyphens")
}
