package testenv

import _ "github.com/coder/coder/v2/codersdk"
